"""Document-masked attention kernels on CUDA side by side (``python -m bench.attention_probe``).

One attention layer at the Llama 3.2-1B shape (32 query heads, 8 key/value heads, head size 64), 2 rows of
4,096 tokens, bf16, forward + backward, median of timed repeats, for three layouts of documents (one per
row; packed, 64 to 1,024 tokens; one of 4,000 tokens and one of 96 per row) and these kernels:

- ``causal``: plain causal SDPA (no documents; the floor the issue measures against);
- ``flex``: today's FlexAttention block mask, and the same with other ``kernel_options``;
- ``njt_cudnn`` / ``njt_flash``: SDPA over nested jagged tensors (one sequence per document), each
  backend forced; key/value heads repeated to the query heads where the backend lacks grouped queries;
- ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` (flash attention's variable-length kernel);
- ``buckets``: the project's variable-length path (documents grouped by padded length, causal SDPA per
  group), its plan built on the host.

Each candidate's output and query gradient are compared with the ``flex`` one (relative L2). Writes
``attention_probe.json`` under ``--out``. Exploration for issue 33's 1.2x target, not a suite test.
"""

from __future__ import annotations

import argparse
import inspect
import json
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _offsets(ids: Any) -> tuple[Any, int, int]:
    """Flat document start offsets over ``batch * seq`` tokens (host), with the longest and shortest."""
    import torch

    batch, seq = ids.shape
    first = torch.ones_like(ids, dtype=torch.bool)
    first[:, 1:] = ids[:, 1:] != ids[:, :-1]
    starts = first.flatten().nonzero().squeeze(1)
    offsets = torch.cat([starts, starts.new_tensor([batch * seq])])
    lengths = offsets.diff()
    return offsets, int(lengths.max()), int(lengths.min())


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bench.gpu_check import ATTENTION_SHAPE, attention_inputs, median_ms
    from hyper_parallel.models._layers import AttentionPlan, attention

    parser = argparse.ArgumentParser(prog="python -m bench.attention_probe")
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--flex-options", default="[]", help="JSON list of kernel_options dicts to try")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.attention_probe: skipped, no CUDA device here (the kernels it compares are CUDA's)")
        return 0
    device = torch.device("cuda")
    batch, seq, heads, kv_heads, head_dim = ATTENTION_SHAPE
    q, k, v, grad, layouts = attention_inputs(ATTENTION_SHAPE, device, torch.bfloat16)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "shape": [batch, seq, heads, kv_heads, head_dim],
        "rows": {},
    }

    def step(forward: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            out = forward()
            torch.autograd.backward(out, grad)
            torch.cuda.synchronize()
            q.grad = k.grad = v.grad = None

        return run

    def outputs(forward: Callable[[], Any]) -> tuple[Any, Any]:
        out = forward()
        torch.autograd.backward(out, grad)
        dq = q.grad.clone()
        q.grad = k.grad = v.grad = None
        return out.detach().float(), dq.float()

    qt = lambda: (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # noqa: E731
    causal = lambda: F.scaled_dot_product_attention(*qt(), is_causal=True, enable_gqa=True).transpose(1, 2)  # noqa: E731
    result["causal_ms"] = median_ms(step(causal), args.repeats)
    for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
        try:
            with sdpa_kernel(getattr(SDPBackend, backend)):
                result[f"causal_{backend.lower()}_ms"] = median_ms(step(causal), args.repeats)
        except Exception as error:  # a probe reports every failure and goes on
            result[f"causal_{backend.lower()}_ms"] = f"{type(error).__name__}: {str(error)[:200]}"
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}), flush=True)

    flex_options = [None, *json.loads(args.flex_options)]
    varlen_params: set[str] = set()
    try:
        from torch.nn.attention.varlen import varlen_attn

        varlen_params = set(inspect.signature(varlen_attn).parameters)
    except ImportError:
        varlen_attn = None  # type: ignore[assignment]

    for name, ids_cpu in layouts.items():
        ids = ids_cpu.to(device)
        block_mask = AttentionPlan.for_device(device).documents(ids, (batch, seq)).layout
        offsets_cpu, longest, shortest = _offsets(ids_cpu)
        offsets = offsets_cpu.to(device)
        row: dict[str, Any] = {"documents": len(offsets_cpu) - 1, "longest": longest}
        candidates: dict[str, Callable[[], Any]] = {}
        for index, options in enumerate(flex_options):

            def flex(options: Any = options, block_mask: Any = block_mask) -> Any:
                extra = {} if options is None else {"kernel_options": options}
                out = block_mask.kernel(*qt(), block_mask=block_mask.mask, enable_gqa=True, **extra)
                return out.transpose(1, 2)

            candidates["flex" if options is None else f"flex_{index}"] = flex

        def nested(
            x: Any, repeat: bool, offsets: Any = offsets, longest: int = longest, shortest: int = shortest
        ) -> Any:
            values = x.reshape(batch * seq, x.shape[2], head_dim)
            if repeat and x.shape[2] != heads:
                values = values.repeat_interleave(heads // x.shape[2], dim=1)
            return torch.nested.nested_tensor_from_jagged(
                values, offsets, max_seqlen=longest, min_seqlen=shortest
            ).transpose(1, 2)

        def njt(backend: Any, repeat: bool) -> Callable[[], Any]:
            def run() -> Any:
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(
                        nested(q, repeat), nested(k, repeat), nested(v, repeat), is_causal=True
                    )
                return out.transpose(1, 2).values().view(batch, seq, heads, head_dim)

            return run

        candidates["njt_cudnn"] = njt(SDPBackend.CUDNN_ATTENTION, True)
        candidates["njt_flash"] = njt(SDPBackend.FLASH_ATTENTION, True)
        if varlen_attn is not None:
            cu = offsets.to(torch.int32)

            def varlen(cu: Any = cu, longest: int = longest) -> Any:
                kwargs: dict[str, Any] = {}
                kk, vv = k, v
                if "enable_gqa" in varlen_params:
                    kwargs["enable_gqa"] = True
                else:
                    kk, vv = (x.repeat_interleave(heads // kv_heads, dim=2) for x in (k, v))
                if "is_causal" in varlen_params:
                    kwargs["is_causal"] = True
                else:
                    kwargs["window_size"] = (-1, 0)
                flat = [x.reshape(batch * seq, x.shape[2], head_dim) for x in (q, kk, vv)]
                out = varlen_attn(*flat, cu, cu, longest, longest, **kwargs)
                return out.view(batch, seq, heads, head_dim)

            candidates["varlen"] = varlen
        # No FlexAttention: the variable-length plan, chosen on the host and moved.
        buckets = AttentionPlan().documents(ids_cpu, (batch, seq), device)
        candidates["buckets"] = lambda buckets=buckets: attention(q, k, v, buckets)
        reference = None
        for label, forward in candidates.items():
            try:
                out, dq = outputs(forward)
                if reference is None:
                    reference = (out, dq)
                    row[f"{label}_ms"] = median_ms(step(forward), args.repeats)
                else:
                    ref_out, ref_dq = reference
                    row[f"{label}_err"] = [
                        float((out - ref_out).norm() / ref_out.norm()),
                        float((dq - ref_dq).norm() / ref_dq.norm()),
                    ]
                    row[f"{label}_ms"] = median_ms(step(forward), args.repeats)
                row[f"{label}_vs_causal"] = row[f"{label}_ms"] / result["causal_ms"]
            except Exception as error:
                row[f"{label}_ms"] = f"{type(error).__name__}: {str(error)[:300]}"
                row[f"{label}_trace"] = traceback.format_exc()[-1500:]
            print(name, label, row.get(f"{label}_ms"), row.get(f"{label}_err"), flush=True)
        result["rows"][name] = row
        (args.out / "attention_probe.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["rows"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
