"""Costs of a transformers causal LM for the preflight estimate (``HfArgs.preflight()``).

Parameters: exact, one group per tensor of the model transformers builds on ``meta`` (tied tensors once).
FLOPs per token: a generic decoder formula read from ``config.json`` (checked against ``FlopCounterMode`` in
the tests): every linear layer's weight once per token (6 x its size, forward and backward: attention
projections with grouped key/value heads and ``head_dim``, a gated or plain MLP, the output head whether tied
or not), and attention's two products over the whole square (12 x seq x heads x head_dim per layer:
TorchTitan's convention, ``hyper_parallel.preflight.flops``, as the native models count). Activations: the
native decoders' terms on these sizes (an estimate: transformers' modules keep a few more intermediates).
"""

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from hyper_parallel.models.hf._tensor_parallel import SPLIT_DIM, plan_weights
from hyper_parallel.models.hf.args import HfArgs, text_config
from hyper_parallel.preflight.flops import FlopCount, flop_count
from hyper_parallel.preflight.model import ActivationCosts, BlockActivations, ParamGroup, Workload

__all__ = ["HfCosts", "decoder_flop_count"]


class _Sizes(NamedTuple):
    """A decoder ``config.json``'s sizes both estimates read: hidden, layers, vocabulary, query heads,
    the query and key/value widths (heads x ``head_dim``), the MLP's intermediate size."""

    d: int
    layers: int
    vocab: int
    heads: int
    q: int
    kv: int
    f: int

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> "_Sizes":
        c = text_config(config)
        d, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
        kv_heads = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or d // heads)
        layers, vocab, f = int(c["num_hidden_layers"]), int(c["vocab_size"]), int(c["intermediate_size"])
        return cls(d, layers, vocab, heads, heads * head_dim, kv_heads * head_dim, f)


def decoder_flop_count(config: dict[str, Any], seq: int, *, gated: bool) -> FlopCount:
    """Model FLOPs of forward and backward per token of a decoder ``config.json`` at length ``seq``;
    ``gated``: the MLP has a gate (three matrices of ``hidden x intermediate``, else two).

    Sliding-window layers count the whole square as well: transformers' ``sdpa`` and ``eager`` mask the
    scores outside the window and compute them all the same."""
    d, layers, vocab, _, q, kv, f = _Sizes.of(config)
    mlp = (3 if gated else 2) * d * f
    attention_params = d * q + 2 * d * kv + q * d
    matmul_params = layers * (attention_params + mlp) + vocab * d
    return flop_count(weights=matmul_params, attention_layers=layers, attention_width=q, seq=seq)


class HfCosts:
    """Parameter, activation and FLOP counts of one transformers causal LM."""

    def __init__(self, args: HfArgs) -> None:
        self.args = args

    def parameters(self) -> Sequence[ParamGroup]:
        layout = self.args.layout()
        splits = plan_weights(layout.tp_plan, layout.shapes, layout.base_prefix)
        seen: set[str] = set()
        groups: list[ParamGroup] = []
        for name, shape in layout.shapes.items():
            if layout.tied and name == layout.output + ".weight":
                continue  # the embeddings' tensor, counted once
            if name in seen:
                continue
            seen.add(name)
            in_block = name.startswith(layout.block_prefix)
            if name.startswith(layout.embedding + "."):
                kind = "embedding"
            elif name.startswith(layout.output + "."):
                kind = "output"
            elif len(shape) == 1:
                kind = "norm"
            elif "mlp" in name:
                kind = "mlp"
            else:
                kind = "attention"
            last = name.rsplit(".", 2)[-2] if name.endswith(".weight") and len(shape) == 2 else ""
            style = splits.get(name)
            groups.append(
                ParamGroup(
                    kind,  # type: ignore[arg-type]
                    shape,
                    tp_dim=SPLIT_DIM.get(style) if style is not None else None,
                    in_block=in_block,
                    linears=(last,) if in_block and last in layout.block_linears else (),
                )
            )
        return groups

    def activations(self, work: Workload) -> ActivationCosts:
        d, layers, vocab, heads, q, kv, f = _Sizes.of(self.args.config())
        p, tokens = work.param_bytes, work.batch * work.seq
        norm = 4 * d + 4 + p * d
        attention = p * d + p * (q + 2 * kv) + p * q + 4 * heads
        mlp = p * d + 3 * p * f
        block_input = p * d
        matmuls = p * (q + 2 * kv + d + 2 * f + d) + p * q + 4 * heads
        block = BlockActivations(
            kept=(2 * norm + attention + mlp) * tokens,
            op=(block_input + matmuls) * tokens,
            inputs=block_input * tokens,
        )
        outside = 8 * tokens + (norm + p * d) * tokens + 4 * vocab * work.batch * (work.seq - 1)
        return ActivationCosts(
            blocks=(block,) * layers, outside=outside, vocab=vocab, note="transformers model: estimated"
        )

    def flop_count(self, seq: int) -> FlopCount:
        gated = any("gate" in name for name in self.args.layout().block_linears)
        return decoder_flop_count(self.args.config(), seq, gated=gated)

    def tp_degrees(self) -> Sequence[int]:
        _, kv_heads = self.args.heads()
        return [1] + [t for t in range(2, kv_heads + 1) if self.args.tp_issue(t) is None]
