"""How a LoRA run holds each parameter, without torch: one statement for the runtime, export and preflight.

A parameter is one of four parts (:data:`Part`): the weight of an adapted linear layer, the token
embedding, the output projection, or anything else. ``peft.base_dtype`` names a :class:`FrozenBase`
whose :meth:`~FrozenBase.storage` says how each part of the frozen base is held: in a floating dtype, or
``'nf4'``. The runtime stores the base so once the weights are loaded (``_base.store_base``), the export
rebuilds the base a run trained against from it, and the preflight counts its bytes from it
(:func:`lora_roles`); before, each of the three wrote the rule out on its own.

NF4's sizes live here too: torchao's block sizes, the bytes of an NF4 tensor (:func:`nf4_bytes`) and
which shapes it can hold whole on how many ranks (:func:`nf4_fits`), read by the rules and the preflight.
"""

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar, Literal, NamedTuple

if TYPE_CHECKING:  # the preflight package imports this module
    from hyper_parallel.preflight.model import ParamGroup

__all__ = [
    "BASES",
    "NF4_BLOCK",
    "NF4_QUANTUM",
    "NF4_SCALER_BLOCK",
    "TORCHAO_VERSION",
    "FrozenBase",
    "Part",
    "Role",
    "Roles",
    "lora_roles",
    "nf4_bytes",
    "nf4_fits",
    "part_of",
]

#: What a parameter is to LoRA's frozen base: an adapted layer's ``weight``, the token embedding, the
#: output projection (the embedding's matrix when tied), or any other (norms, biases, unadapted layers).
Part = Literal["adapted", "embedding", "output", "rest"]

#: The torchao release QLoRA is written against (the ``qlora`` extra pins it).
TORCHAO_VERSION = "0.18.0"

#: Values per NF4 block (one int8 scale each) and blocks per scale block (one float scale each): torchao's
#: ``to_nf4`` defaults, which the runtime uses.
NF4_BLOCK = 64
NF4_SCALER_BLOCK = 256
#: A weight stored as NF4 holds a multiple of this many values (whole scale blocks).
NF4_QUANTUM = NF4_BLOCK * NF4_SCALER_BLOCK


def nf4_bytes(numel: int, dtype_bytes: int = 4) -> int:
    """Bytes of torchao's ``NF4Tensor`` of ``numel`` values quantized from ``dtype_bytes``-byte floats.

    Two 4-bit codes per byte, an int8 scale per block of 64 values, a float scale per 256 blocks, the
    scales' mean and the 16-value code book (the last two whole on every rank of a sharded tensor).
    """
    return numel // 2 + numel // NF4_BLOCK + dtype_bytes * (numel // NF4_QUANTUM) + 17 * dtype_bytes


def nf4_fits(shape: Sequence[int], shards: int = 1) -> bool:
    """Whether a weight of ``shape`` can be NF4 on ``shards`` ranks sharding its rows (FSDP2): each rank
    must hold whole rows and whole scale blocks, since the runtime quantizes the whole weight and cuts
    its codes and scales into the same row chunks."""
    return shape[0] % shards == 0 and math.prod(shape) % (NF4_QUANTUM * shards) == 0


class FrozenBase:
    """How a LoRA run stores its frozen base: one subclass per value of ``peft.base_dtype``.

    ``BASES`` maps each value to its instance, so the YAML keeps its string and the code asks the
    instance rather than comparing the string.
    """

    #: Whether it quantizes weights (NF4): then torchao, the NF4 sizes and QLoRA's layouts are checked, and
    #: a checkpoint never holds the base (the run builds it again, from ``model.weights_path`` or the
    #: seed, and quantizes it the same way).
    quantized: ClassVar[bool] = False

    def storage(self, part: Part, compute_dtype: str, quantize_embeddings: bool) -> str:
        """How ``part`` is held: a floating dtype's name or ``'nf4'`` (``compute_dtype``: the run's
        ``training.mixed_precision_param``)."""
        raise NotImplementedError

    def issues(self, compute_dtype: str) -> Iterator[tuple[str, str]]:
        """Yield ``(root field path, message)`` this base refuses whatever the model (see ``_rules``)."""
        yield from ()


class _Float32Base(FrozenBase):
    """As the model is built: float32."""

    def storage(self, part: Part, compute_dtype: str, quantize_embeddings: bool) -> str:
        return "float32"


class _BFloat16Base(FrozenBase):
    """Every frozen tensor in bfloat16: the dtype a bfloat16 run computes in, half of float32's bytes."""

    def storage(self, part: Part, compute_dtype: str, quantize_embeddings: bool) -> str:
        return "bfloat16"

    def issues(self, compute_dtype: str) -> Iterator[tuple[str, str]]:
        if compute_dtype != "bfloat16":
            yield (
                "peft.base_dtype",
                "'bfloat16' holds the frozen base in the dtype the run computes it in, which must then be "
                f"bfloat16: set training.mixed_precision_param to bfloat16, got {compute_dtype!r}",
            )


class _NF4Base(FrozenBase):
    """QLoRA: the adapted layers' weights (with ``quantize_embeddings`` the embeddings too) as torchao's
    NF4, the rest in the compute dtype, which every layout computes with."""

    quantized = True

    def storage(self, part: Part, compute_dtype: str, quantize_embeddings: bool) -> str:
        if part == "adapted" or (quantize_embeddings and part in ("embedding", "output")):
            return "nf4"
        return compute_dtype


#: The frozen base of each ``peft.base_dtype``.
BASES: Mapping[str, FrozenBase] = {
    "float32": _Float32Base(),
    "bfloat16": _BFloat16Base(),
    "nf4": _NF4Base(),
}


def part_of(module: str, key: str, adapted: bool, embeddings: Mapping[str, str]) -> Part:
    """The part parameter ``key`` of ``module`` is: ``adapted`` says the module has adapters;
    ``embeddings`` are the model's (``ModelArgs.embedding_layers``)."""
    if adapted and key == "weight":
        return "adapted"
    for kind, name in embeddings.items():
        if module == name:
            return "output" if kind == "output" else "embedding"
    return "rest"


#: How a parameter tensor is held: ``trained`` (float32 master, gradient, optimizer states), ``frozen``
#: (``Roles.frozen_dtype``, nothing else) or ``nf4`` (frozen, 4-bit NormalFloat).
Role = Literal["trained", "frozen", "nf4"]


class Roles(NamedTuple):
    """Every parameter group of a run with the role it plays, and what LoRA added (nothing without it)."""

    groups: tuple[tuple["ParamGroup", Role], ...]
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


def lora_roles(
    groups: Sequence["ParamGroup"],
    targets: frozenset[str],
    rank: int,
    storage: Callable[[Part], str],
) -> Roles:
    """``groups`` (a model's ``ModelCosts.parameters()``) by role, with the adapters LoRA adds to the
    ``targets`` layers, each frozen group held as ``storage`` says of its part.

    A group shared by several linear layers (``linears``) is split into one group per layer, so that a
    layer LoRA adapts and one it does not are told apart. Adapters are sharded by tensor parallelism as
    the runtime does: a column-wise layer's split their rows like its weight, a row-wise layer's are
    replicated, with the gradients DTensor leaves them without FSDP (``tests/preflight/test_sharding.py``).
    """

    def role(part: Part) -> Role:
        return "nf4" if storage(part) == "nf4" else "frozen"

    out: list[tuple[ParamGroup, Role]] = []
    adapters: list[tuple[ParamGroup, Role]] = []
    adapted = 0
    for group in groups:
        if group.kind in ("embedding", "output"):
            out.append((group, role("output" if group.kind == "output" else "embedding")))
            continue
        if not group.linears or not targets.intersection(group.linears):
            out.append((group, role("rest")))
            continue
        each = group.copies // len(group.linears)
        for layer in group.linears:
            one = group._replace(copies=each, linears=(layer,))
            if layer not in targets:
                out.append((one, role("rest")))
                continue
            out.append((one, role("adapted")))
            adapted += each
            rows, columns = group.shape
            if group.tp_dim == 0:  # column-wise: A and B split on their rows like the weight; without
                # FSDP the gradient of A (whose rows are the rank) is left whole, a partial sum
                a = one._replace(shape=(rank, columns), tp_dim=0, tp_full_grad=True)
                b = one._replace(shape=(rows, rank), tp_dim=0)
            else:  # row-wise (or none): A and B replicated; A's gradient split like the layer's input
                a = one._replace(shape=(rank, columns), tp_dim=None, tp_grad_dim=group.tp_dim)
                b = one._replace(shape=(rows, rank), tp_dim=None)
            adapters += [(a, "trained"), (b, "trained")]
    return Roles(
        tuple(out + adapters),
        f"LoRA rank {rank}",
        adapted,
        storage("rest"),
        storage("embedding") == "nf4",
    )
