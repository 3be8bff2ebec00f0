"""What a model tells the preflight: its parameter tensors and the bytes and FLOPs of one step.

A model's arguments class offers ``preflight() -> ModelCosts``; each model computes these numbers in its
own torch-free ``estimate`` module from the same arguments its PyTorch module is built from, so the
preflight package needs no model names and never imports torch.
"""

from collections.abc import Sequence
from typing import Literal, NamedTuple, Protocol

from hyper_parallel.preflight.flops import FlopCount

__all__ = ["ActivationCosts", "BlockActivations", "ModelCosts", "ParamGroup", "Workload", "parameter_total"]

#: Layer types a parameter is reported under.
Kind = Literal["embedding", "attention", "gated_deltanet", "mlp", "moe", "norm", "output", "vision"]


class ParamGroup(NamedTuple):
    """``copies`` parameter tensors of one ``shape``, split by tensor parallelism along ``tp_dim`` (or not).

    ``in_block`` says the tensor belongs to a transformer block that FSDP2 shards and gathers on its own;
    the others (embeddings, final norm, output, vision stem) belong to the root module.
    ``tp_full_grad`` marks a TP-split tensor whose gradient autograd leaves replicated (full size) when no
    FSDP reduce-scatter shards it: DTensor's backward of a row-split embedding does so.
    ``experts_per_token`` marks stacked expert weights: dim 0 is the expert (split by expert parallelism,
    ``parallelism.ep``) and one token uses that many of its rows (the active parameters).
    ``tp_grad_dim`` marks a tensor TP leaves whole whose gradient autograd leaves split along that
    dimension when no FSDP reduce-scatter reshards it (LoRA's ``A`` of a row-wise layer: its input is).
    ``linears`` names the linear layers of the blocks (their last names, as ``peft.targets`` names them)
    whose ``out x in`` weights these tensors are, the copies shared evenly among them: what LoRA adapts.
    """

    kind: Kind
    shape: tuple[int, ...]
    copies: int = 1
    tp_dim: int | None = None
    in_block: bool = True
    tp_full_grad: bool = False
    experts_per_token: int | None = None
    linears: tuple[str, ...] = ()
    tp_grad_dim: int | None = None

    @property
    def numel(self) -> int:
        """Elements of one tensor of the group."""
        n = 1
        for size in self.shape:
            n *= size
        return n

    @property
    def active_numel(self) -> int:
        """Elements of one tensor of the group one token computes with (all, unless expert weights)."""
        if self.experts_per_token is None:
            return self.numel
        return self.numel // self.shape[0] * self.experts_per_token


class Workload(NamedTuple):
    """One micro batch on one rank: the sizes that activation bytes and FLOPs depend on."""

    batch: int
    seq: int
    #: Bytes per element of the compute (mixed-precision parameter) dtype: 2 for bf16/fp16, 4 for fp32.
    param_bytes: int
    tp: int = 1
    sequence_parallel: bool = False


class BlockActivations(NamedTuple):
    """Bytes one transformer block keeps for backward, per activation-checkpoint treatment.

    ``kept``: no checkpointing. ``op``: selective op checkpointing (the block input plus the outputs of
    its matmuls and attention). ``inputs``: full checkpointing (only the block input).
    """

    kept: int
    op: int
    inputs: int


class ActivationCosts(NamedTuple):
    """Activation bytes of one micro batch: per block, plus what lies outside them (never recomputed)."""

    blocks: tuple[BlockActivations, ...]
    outside: int
    #: Logits per token (the vocabulary, gathered under TP): the loss holds them and a float32 copy.
    vocab: int
    #: Short note on what is left out, shown in the report (e.g. the vision tower of a VL model).
    note: str = ""
    #: Width of the final hidden states the output projection reads (what the fused loss's gradient of
    #: them and of the output weight take); 0 where the model does not say.
    hidden: int = 0


class ModelCosts(Protocol):
    """Torch-free costs of a model; returned by the model arguments' ``preflight()``."""

    def parameters(self) -> Sequence[ParamGroup]:
        """Every parameter tensor (tied tensors once), grouped by shape, kind and TP split."""
        ...

    def activations(self, work: Workload) -> ActivationCosts:
        """Bytes saved for backward on one rank for one micro batch of ``work``."""
        ...

    def flop_count(self, seq: int) -> FlopCount:
        """Model FLOPs of forward plus backward per token at sequence length ``seq``, in the convention of
        :mod:`hyper_parallel.preflight.flops` (TorchTitan's)."""
        ...

    def tp_degrees(self) -> Sequence[int]:
        """Tensor-parallel degrees the model's sharding plan accepts."""
        ...


def parameter_total(costs: ModelCosts) -> int:
    """Every parameter of the model ``costs`` describes, tied tensors once."""
    return sum(group.numel * group.copies for group in costs.parameters())
