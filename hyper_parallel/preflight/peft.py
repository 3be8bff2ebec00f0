"""What parameter-efficient fine-tuning changes in the preflight: the tensors that train and those frozen.

Without ``peft`` (full fine-tuning) every parameter trains: float32 master, float32 gradient, the
optimizer's float32 states. With LoRA (``peft: LoRA.Config``) only the adapters do: each targeted linear
layer of the blocks (``ParamGroup.linears`` names them) gets ``A`` (``rank x in``) and ``B``
(``out x rank``), sharded by tensor parallelism as the runtime does (a column-wise layer's adapters split
their rows like its weight, a row-wise layer's are replicated), with the gradients DTensor leaves them
without FSDP (measured in ``tests/preflight/test_sharding.py``). The base is frozen: no gradient, no
optimizer state, stored as the model holds it (float32), in bfloat16 (``base_dtype: bfloat16``), or with
``base_dtype: nf4`` (QLoRA) the weights of the adapted layers (with ``quantize_embeddings`` also the
embedding and output matrices) as torchao's ``NF4Tensor`` (:func:`nf4_bytes`) and the rest in the compute
dtype. Torch-free, as the whole preflight.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, NamedTuple

from hyper_parallel.preflight.model import ParamGroup

if TYPE_CHECKING:
    from hyper_parallel.preflight.inputs import RunConfig

__all__ = ["NF4_BLOCK", "NF4_QUANTUM", "NF4_SCALER_BLOCK", "Roles", "nf4_bytes", "roles"]

#: Values per NF4 block (one int8 scale each) and blocks per scale block (one float scale each): torchao's
#: ``to_nf4`` defaults, which the runtime uses.
NF4_BLOCK = 64
NF4_SCALER_BLOCK = 256
#: A weight stored as NF4 holds a multiple of this many values (whole scale blocks).
NF4_QUANTUM = NF4_BLOCK * NF4_SCALER_BLOCK

#: How a parameter tensor is held: ``trained`` (float32 master, gradient, optimizer states), ``frozen``
#: (``Roles.frozen_dtype``, nothing else) or ``nf4`` (frozen, 4-bit NormalFloat).
Role = Literal["trained", "frozen", "nf4"]


def nf4_bytes(numel: int, dtype_bytes: int = 4) -> int:
    """Bytes of torchao's ``NF4Tensor`` of ``numel`` values quantized from ``dtype_bytes``-byte floats.

    Two 4-bit codes per byte, an int8 scale per block of 64 values, a float scale per 256 blocks, the
    scales' mean and the 16-value code book (the last two whole on every rank of a sharded tensor).
    """
    return numel // 2 + numel // NF4_BLOCK + dtype_bytes * (numel // NF4_QUANTUM) + 17 * dtype_bytes


class Roles(NamedTuple):
    """Every parameter group of a run with the role it plays, and what LoRA added (nothing without it)."""

    groups: tuple[tuple[ParamGroup, Role], ...]
    #: ``"LoRA rank 8"``; empty for full fine-tuning.
    method: str = ""
    #: Linear layers given adapters, over the whole model.
    adapted: int = 0
    #: The dtype of the ``frozen`` tensors: ``peft.base_dtype``, or under ``nf4`` the compute dtype.
    frozen_dtype: str = "float32"
    #: Whether the embedding and output matrices are NF4 (``quantize_embeddings``).
    nf4_embeddings: bool = False

    def elements(self, *roles: Role) -> int:
        """Parameter elements of the groups in ``roles`` (tied tensors once)."""
        return sum(g.numel * g.copies for g, role in self.groups if role in roles)


def roles(cfg: "RunConfig", groups: Sequence[ParamGroup]) -> Roles:
    """The groups of ``cfg``'s model (its ``ModelCosts.parameters()``) and LoRA's adapters, by role.

    A group shared by several linear layers (``linears``) is split into one group per layer, so that a
    layer LoRA adapts and one it does not are told apart.
    """
    from hyper_parallel.components.peft import EMBEDDING_LAYERS, LoRA

    peft = cfg.peft
    if not isinstance(peft, LoRA.Config):
        return Roles(tuple((g, "trained") for g in groups))
    targets = peft.layer_names
    nf4 = peft.base_dtype == "nf4"
    adapted_role: Role = "nf4" if nf4 else "frozen"
    out: list[tuple[ParamGroup, Role]] = []
    adapters: list[tuple[ParamGroup, Role]] = []
    adapted = 0
    for group in groups:
        if nf4 and peft.quantize_embeddings and group.kind in EMBEDDING_LAYERS:
            out.append((group, "nf4"))
            continue
        if not group.linears or not targets.intersection(group.linears):
            out.append((group, "frozen"))
            continue
        each = group.copies // len(group.linears)
        for layer in group.linears:
            one = group._replace(copies=each, linears=(layer,))
            if layer not in targets:
                out.append((one, "frozen"))
                continue
            out.append((one, adapted_role))
            adapted += each
            rows, columns = group.shape
            if group.tp_dim == 0:  # column-wise: A and B split on their rows like the weight; without
                # FSDP the gradient of A (whose rows are the rank) is left whole, a partial sum
                a = one._replace(shape=(peft.rank, columns), tp_dim=0, tp_full_grad=True)
                b = one._replace(shape=(rows, peft.rank), tp_dim=0)
            else:  # row-wise (or none): A and B replicated; A's gradient split like the layer's input
                a = one._replace(shape=(peft.rank, columns), tp_dim=None, tp_grad_dim=group.tp_dim)
                b = one._replace(shape=(rows, peft.rank), tp_dim=None)
            adapters += [(a, "trained"), (b, "trained")]
    frozen_dtype = cfg.training.mixed_precision_param if nf4 else peft.base_dtype
    return Roles(
        tuple(out + adapters),
        f"LoRA rank {peft.rank}",
        adapted,
        frozen_dtype,
        nf4 and peft.quantize_embeddings,
    )
