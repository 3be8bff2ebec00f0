"""Model FLOPs per token in one stated convention, and the MFU they give against a device's peak.

The convention is TorchTitan's (``get_nparams_and_flops`` of its Llama models; PaLM's appendix B): per token,
forward plus backward, ``6 N + 12 L H Q T`` with ``N`` the weights a token is multiplied by (the weights of
every matmul and convolution: the output projection counts, tied to the embedding or not, as it is a matmul
the step runs; the embedding table does not), ``L`` attention layers of ``H`` heads of size ``Q`` and ``T``
the sequence length. The attention term counts ``QK^T`` and ``AV`` over the whole ``T x T`` square (2 products
forward, 4 backward, 2 FLOPs a multiply-add), not the causal half a kernel computes, and no recomputation
(flash attention's backward recomputes the scores: a fifth product that is not model work). Activation
checkpointing's recomputation is not counted either. Three departures from TorchTitan's own code, all ours to
state: a tied output projection counts (TorchTitan subtracts the tied tensor as the embedding and would drop
the projection's matmul), norms' scales and other elementwise weights are left out of ``N`` (TorchTitan's sum
includes them: under 0.01% of a model's count), and work its formula has no term for (Gated DeltaNet's chunked
rule, depthwise convolutions' sequence padding) is counted as the kernel runs it, in ``other``.

Every FLOPs figure the project prints (the preflight report, the training log's ``tflops``/``mfu``,
``python -m bench gpu``) comes from :class:`FlopCount` and :func:`mfu`; Megatron's causal count (the
attention term halved) is :attr:`FlopCount.causal`, printed beside it where useful and named so.
"""

from typing import NamedTuple

__all__ = ["CAUSAL_CONVENTION", "CONVENTION", "FlopCount", "flop_count", "mfu"]

#: The convention every printed FLOPs and MFU figure follows, as the log and ``bench gpu`` name it.
CONVENTION = "TorchTitan's convention, 6N + 12LHQT per token (attention counted whole, no recomputation)"
#: The figure printed beside it: the attention term halved (Megatron's causal count).
CAUSAL_CONVENTION = "causal count (attention term halved)"


class FlopCount(NamedTuple):
    """Model FLOPs of forward plus backward per token, split by what the conventions treat differently."""

    #: ``6 N``: N the weights one token is multiplied by (module docstring).
    weights: int
    #: ``12 L H Q T``: attention's two products over the whole square, forward and backward.
    attention: int
    #: Sequence mixing the formula has no term for, counted as it runs (never halved).
    other: int = 0

    @property
    def total(self) -> int:
        """FLOPs per token in the project's convention (TorchTitan's)."""
        return self.weights + self.attention + self.other

    @property
    def causal(self) -> int:
        """FLOPs per token with the attention term halved (the causal half of the square)."""
        return self.weights + self.attention // 2 + self.other


def flop_count(
    *, weights: int, attention_layers: int, attention_width: int, seq: int, other: float = 0
) -> FlopCount:
    """The convention's count for ``weights`` multiplied per token and ``attention_layers`` softmax
    attention layers of ``attention_width`` = heads x head size (the query width) over ``seq`` tokens."""
    return FlopCount(
        weights=6 * weights, attention=12 * attention_layers * attention_width * seq, other=int(other)
    )


def mfu(flops_per_second: float | None, peak_flops: float | None) -> float | None:
    """Model FLOPs utilisation in percent: achieved model FLOP/s over the device's dense peak (None when
    either is unknown)."""
    if flops_per_second is None or not peak_flops:
        return None
    return 100.0 * flops_per_second / peak_flops
