"""Per-rank memory and step cost of a resolved ``TrainerConfig``: plain arithmetic, no torch.

Assumptions (the trainer's layout; see each term): parameters, gradients and optimizer states are
float32 and sharded by FSDP2 over ``dp_shard`` (rank 0 holds the largest shard, padded rows included)
after tensor parallelism split them per the model's plan; optimizer states are float32 (AdamW: two
moments and a step per tensor); compute runs in ``training.mixed_precision_param`` (see
``_compute_copies`` for the weight copies that takes); activations are what autograd saves for backward
for one micro batch under the activation-checkpoint mode (stage 0 of a pipeline holds ``pp`` micro
batches of its blocks; compiled blocks save about half, see ``COMPILED_BLOCK_SAVES``); the loss adds the
logits and, as its backward starts, their gradient (see :func:`logits_bytes`). The peak comes as the
backward starts, before any gradient exists (the optimizer's ``zero_grad`` frees them every step): the
gradients count only when they outlive a micro batch (gradient accumulation, a pipeline) or outweigh the
activations (see ``Estimate.device_total``). Context parallelism divides the
sequence; ``dp_replicate`` replicates. Expert weights (``ParamGroup.experts_per_token``) are split
along the expert dimension by ``ep`` and their remaining ``dp_shard / ep`` ranks by FSDP, so a gathered
block holds ``1 / ep`` of its experts; each MoE layer's tokens cross ranks in four all-to-alls per micro
batch (dispatch and combine, forward and backward), ``(ep - 1) / ep`` of them on average (uniform routing).
With ``peft`` (LoRA) only the adapters have gradients and optimizer states; the frozen base is held as
``preflight.peft`` says (float32, or NF4 for the adapted layers' weights).
"""

import math
from typing import TYPE_CHECKING, Any, NamedTuple

from hyper_parallel.components.loss.chunking import loss_chunking
from hyper_parallel.preflight.model import (
    ActivationCosts,
    BlockActivations,
    ModelCosts,
    ParamGroup,
    Workload,
)
from hyper_parallel.preflight.peft import nf4_bytes, roles

if TYPE_CHECKING:
    from hyper_parallel.preflight.inputs import RunConfig

__all__ = ["Estimate", "Layout", "estimate", "model_costs"]

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def logits_bytes(compute: int, compiled_loss: bool) -> int:
    """Bytes per logit element at the loss's peak (the start of its backward), ``compute`` the bytes of
    the compute dtype. Eager: the logits, the float32 log-probabilities the loss keeps and one float32
    gradient of them (+8); compiled: the fused loss reads the logits in chunks, so the logits and their
    gradient in the compute dtype. Measured on an H200 (Llama 3.2-1B full/LoRA/QLoRA, Qwen 3.5 0.8B,
    eager and compiled; ``python -m bench gpu --check``): the totals within 10%.
    """
    return 2 * compute if compiled_loss else compute + 8


def fused_loss_bytes(tokens: int, vocab: int, hidden: int, compute: int, chunk: int) -> int:
    """Bytes of the fused, chunked loss at its peak (``components/loss/_chunked.py``), ``compute`` the
    bytes of the compute dtype: one chunk's float32 logits, the float32 temporary of their log-sum-exp
    and their gradient in the compute dtype (the same tensor in float32), the float32 accumulator of the
    output weight's gradient and the gradient of the hidden states; no ``tokens x vocab`` tensor."""
    chunk_bytes = min(chunk, tokens) * vocab * (8 + (compute if compute < 4 else 0))
    return chunk_bytes + 4 * vocab * hidden + compute * tokens * hidden


class Layout(NamedTuple):
    """The knobs a suggestion may turn: parallel degrees, micro batch and activation checkpointing."""

    degrees: dict[str, int]
    micro_batch: int
    #: "none", "full", "op" or a block frequency n (checkpoint every n-th block).
    ac: str | int

    @property
    def world_size(self) -> int:
        return math.prod(self.degrees[k] for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp"))

    def micro_batches(self, global_batch: int) -> int:
        """Micro batches per optimizer step on each rank (``TrainingConfig.gradient_accumulation_steps``
        for this layout, without its refusal: a suggested layout is checked where it is offered)."""
        dp = self.degrees["dp_replicate"] * self.degrees["dp_shard"]
        return global_batch // max(self.micro_batch * dp, 1)


class Estimate(NamedTuple):
    """The preflight numbers of one config on one layout (bytes are per rank, on rank 0)."""

    model: str
    layout: Layout
    world_size_known: bool
    seq: int
    global_batch: int
    compute_dtype: str
    reduce_dtype: str
    optimizer: str
    optimizer_states: int
    cpu_offload: bool
    #: Parameter elements per layer type (tied tensors once) and in total.
    params_by_kind: dict[str, int]
    params_total: int
    #: Parameter elements one token computes with (== ``params_total`` for a dense model).
    params_active: int
    #: Bytes per rank, in report order: parameters, gradients, optimizer, activations, fsdp buffers, logits.
    terms: dict[str, int]
    #: Model FLOPs per token of what trains (``preflight/flops.py``: TorchTitan's convention) and the same
    #: with the attention term halved (the causal count, printed beside it).
    flops_per_token: int
    causal_flops_per_token: int
    note: str = ""
    #: Bytes each rank sends in the experts' all-to-alls over one optimizer step (0 without ``ep``).
    all_to_all_bytes: int = 0
    #: What ``torch.compile`` covers (``compile.components`` when enabled): "model", "loss".
    compiled: tuple[str, ...] = ()
    #: Tokens per chunk of the fused loss (``loss.chunk_tokens``); 0: the whole logits.
    loss_chunk_tokens: int = 0
    #: The parameter-efficient method (``"LoRA rank 8"``); empty when every parameter trains.
    peft: str = ""
    #: Parameter elements that train (with ``peft``: the adapters) and frozen ones (the base model), of
    #: which ``quantized`` are stored as NF4; over the whole model, tied tensors once.
    trainable: int = 0
    frozen: int = 0
    quantized: int = 0
    #: Linear layers given adapters (with ``peft``).
    adapted_layers: int = 0
    #: Whether the embedding and output matrices are among the ``quantized`` (``quantize_embeddings``).
    nf4_embeddings: bool = False
    #: The dtype of the frozen parameters that are not NF4.
    frozen_dtype: str = "float32"
    #: Bytes per rank of the frozen parameters (part of the ``parameters`` term).
    frozen_bytes: int = 0

    #: Whether the gradients are alive at the activations' peak: they outlive a micro batch under
    #: gradient accumulation or a pipeline; otherwise they appear as the backward frees the activations.
    gradients_at_peak: bool = True

    @property
    def device_total(self) -> int:
        """Bytes on the device at the peak: the states, the weight copies, and the larger of the
        activations with the logits (as the backward starts) and the gradients (as it ends), or their sum
        when the gradients are alive at the peak; sharded states offloaded to the host are not counted."""
        host = ("parameters", "gradients", "optimizer") if self.cpu_offload else ()
        on_device = {k: v for k, v in self.terms.items() if k not in host}
        if self.gradients_at_peak:
            return sum(on_device.values())
        grads = on_device.pop("gradients", 0)
        backward_start = on_device.pop("activations", 0) + on_device.pop("logits", 0)
        return sum(on_device.values()) + max(grads, backward_start)

    @property
    def flops_per_step(self) -> int:
        """Model FLOPs of one optimizer step over all ranks (forward and backward, in the convention of
        ``preflight/flops.py``: attention counted whole, no recomputation)."""
        return self.flops_per_token * self.global_batch * self.seq


def model_costs(cfg: "RunConfig") -> ModelCosts | None:
    """The model's torch-free cost model, or ``None`` when its arguments offer no ``preflight()``."""
    method = getattr(cfg.model.args, "preflight", None)
    return method() if callable(method) else None


def _local_numel(group: ParamGroup, tp: int, dp: int, ep: int = 1) -> int:
    """Elements of rank 0's shard: TP splits ``tp_dim``, EP the experts, then FSDP2 dim 0 (all round up).

    Expert weights are split by ``ep`` first and by FSDP over the ``dp / ep`` ranks left.
    """
    shape = list(group.shape)
    if group.tp_dim is not None and tp > 1:
        shape[group.tp_dim] = -(-shape[group.tp_dim] // tp)
    if group.experts_per_token is not None and ep > 1:
        shape[0] = -(-shape[0] // ep)
        dp = dp // ep
    if dp > 1:
        shape[0] = -(-shape[0] // dp)
    return math.prod(shape)


def _optimizer_states(optimizer: Any) -> tuple[str, int]:
    """Name and float32 states per parameter element of the optimizer (Adam-like: 2, +1 with AMSGrad)."""
    name = type(optimizer).__qualname__.removesuffix(".Config")
    if hasattr(optimizer, "betas"):
        return name, 3 if getattr(optimizer, "amsgrad", False) else 2
    if hasattr(optimizer, "momentum"):
        return name, 1 if optimizer.momentum > 0 else 0
    return name, 2  # an unknown optimizer: assume Adam-like moments


#: What a ``torch.compile``d block saves for backward, as a share of the eager block's saved tensors: the
#: fused element-wise chains (norms, gates, RoPE, residuals) keep their inputs, not every intermediate.
#: Measured on an H200 (``python -m bench gpu --check``, bf16, seq 4,096, batch 2): 0.51 for Llama 3.2-1B and
#: 0.52 for Qwen 3.5 0.8B, from each run's compiled peak less the estimate's other terms.
COMPILED_BLOCK_SAVES = 0.5


def _activation_bytes(
    acts: ActivationCosts, ac: str | int, stage_blocks: int, in_flight: int, compiled: bool = False
) -> int:
    blocks = acts.blocks[:stage_blocks]
    share = COMPILED_BLOCK_SAVES if compiled else 1.0

    def kept_of(block: BlockActivations) -> float:
        return block.kept * share

    if ac == "none":
        kept = sum(kept_of(b) for b in blocks)
    elif ac == "full":
        kept = sum(b.inputs for b in blocks)
    elif ac == "op":
        kept = sum(b.op for b in blocks)
    else:  # every n-th block fully checkpointed, as the trainer counts blocks from 1
        n = int(ac)
        kept = sum(b.inputs if (i + 1) % n == 0 else kept_of(b) for i, b in enumerate(blocks))
    return int(kept) * in_flight + acts.outside


def _compute_copies(p: int, r: int, dp: int, gathered: "_Gathered", n_layers: int, compiled: bool) -> int:
    """Bytes of the compute-dtype weight copies (and gradients before their reduction) alive at once.

    Under FSDP2 (``dp_shard`` > 1): the root module's weights stay gathered through forward and backward,
    two blocks are gathered at a time (one prefetched), and one block's gradients exist unsharded, plus
    their copy in the reduce dtype; frozen weights are gathered too (an NF4 weight as NF4), but have no
    gradient. Without FSDP, autocast casts every float weight to the compute dtype (those that train once
    per step, the frozen ones at each use) and autograd keeps each copy for the backward, unless compute
    is float32 (or the weight is stored in it: QLoRA's frozen rest); an NF4 weight is dequantized at each
    use and kept as NF4 (measured: a LoRA run holds the frozen base's bf16 copies, a QLoRA run does not,
    1.8 GiB apart on the Llama 3.2-1B shape), except in compiled blocks, whose graphs keep the dequantized
    weight instead (measured: 2.0 GiB more than eager). An NF4 output projection is dequantized again as
    the backward starts, at the peak, in eager mode.
    """
    blocks = max(n_layers, 1)  # an average block (vision blocks folded in)
    head = 0 if compiled else p * gathered.nf4_head
    if dp > 1:
        grads = gathered.trained_blocks / blocks
        return int(gathered.root + 2 * gathered.blocks / blocks + grads * (p + (r if r != p else 0))) + head
    return (p * (gathered.cast + (gathered.quantized if compiled else 0)) if p < 4 else 0) + head


class _Gathered(NamedTuple):
    """Bytes of the gathered weights in compute dtype (root, all blocks), elements of the block weights
    that train, of the float weights autocast casts, of the NF4 weights and of an NF4 output projection."""

    root: int
    blocks: int
    trained_blocks: int
    cast: int
    quantized: int
    nf4_head: int


def evaluate(cfg: "RunConfig", costs: ModelCosts, layout: Layout, world_size_known: bool) -> Estimate:
    """The estimate of ``cfg`` as if run with ``layout`` (its own layout, or a suggested change)."""
    training, deg = cfg.training, layout.degrees
    p = _DTYPE_BYTES[training.mixed_precision_param]
    r = _DTYPE_BYTES[training.mixed_precision_reduce]
    tp, dp, pp, ep = deg["tp"], deg["dp_shard"], deg["pp"], deg.get("ep", 1)
    groups = costs.parameters()
    by_kind: dict[str, int] = {}
    for g in groups:
        by_kind[g.kind] = by_kind.get(g.kind, 0) + g.numel * g.copies
    active = sum(g.active_numel * g.copies for g in groups)
    held = roles(cfg, groups)
    stage = 1 / pp  # pipeline stage 0 holds its share of the blocks and the whole root (conservative)
    local = grads = tensors = frozen = 0
    gathered_root = gathered_blocks = trained_blocks = cast = quantized = nf4_head = 0  # see _Gathered
    frozen_bytes = _DTYPE_BYTES[held.frozen_dtype]
    for g, role in held.groups:
        count = math.ceil(g.copies * stage) if g.in_block else g.copies
        shard = _local_numel(g, tp, dp, ep)
        full = _local_numel(g, tp, ep if g.experts_per_token is not None else 1, ep)
        if role == "trained":
            local += shard * count
            grad = g._replace(tp_dim=g.tp_grad_dim) if g.tp_grad_dim is not None and dp == 1 else g
            grads += _local_numel(grad, 1 if g.tp_full_grad and dp == 1 else tp, dp, ep) * count
            tensors += count
            trained_blocks += full * g.copies if g.in_block else 0
        if role == "nf4":
            frozen += nf4_bytes(shard) * count
            held_bytes = nf4_bytes(full) * g.copies
            quantized += full * g.copies
            nf4_head = max(nf4_head, 0 if g.in_block else full)  # the output projection (or tied embedding)
        else:
            frozen += frozen_bytes * shard * count if role == "frozen" else 0
            held_bytes = p * full * g.copies
            cast += 0 if role == "frozen" and frozen_bytes == p else full * g.copies
        if g.in_block:
            gathered_blocks += held_bytes
        else:
            gathered_root += held_bytes
    acts = costs.activations(
        Workload(
            batch=layout.micro_batch,
            seq=training.seq_len // deg["cp"],
            param_bytes=p,
            tp=tp,
            sequence_parallel=cfg.parallelism.sequence_parallel,
        )
    )
    n_layers = len(acts.blocks)
    name, states = _optimizer_states(cfg.optimizer)
    tokens = layout.micro_batch * training.seq_len // deg["cp"]
    compiled_blocks = cfg.compile.enable and "model" in cfg.compile.components
    compiled_loss = cfg.compile.enable and "loss" in cfg.compile.components
    chunk = loss_chunking(cfg, tp, pp).tokens
    terms = {
        "parameters": 4 * local + frozen,
        "gradients": 4 * grads,
        "optimizer": 4 * states * local + (4 * tensors if states else 0),
        "activations": _activation_bytes(
            acts, layout.ac, math.ceil(n_layers * stage), pp if pp > 1 else 1, compiled_blocks
        ),
        "fsdp buffers": _compute_copies(
            p,
            r,
            dp,
            _Gathered(gathered_root, gathered_blocks, trained_blocks, cast, quantized, nf4_head),
            n_layers,
            compiled_blocks,
        ),
        "logits": fused_loss_bytes(tokens, acts.vocab, acts.hidden, p, chunk)
        if chunk
        else tokens * acts.vocab * logits_bytes(p, compiled_loss),
    }
    flops = costs.flop_count(training.seq_len)
    return Estimate(
        model=cfg.model.title(),
        layout=layout,
        world_size_known=world_size_known,
        seq=training.seq_len,
        global_batch=training.global_batch_size,
        compute_dtype=training.mixed_precision_param,
        reduce_dtype=training.mixed_precision_reduce,
        optimizer=name,
        optimizer_states=states,
        cpu_offload=training.enable_cpu_offload,
        params_by_kind=by_kind,
        params_total=sum(by_kind.values()),
        params_active=active,
        terms=terms,
        flops_per_token=_trained_flops(flops.total, held.groups),
        causal_flops_per_token=_trained_flops(flops.causal, held.groups),
        note=acts.note,
        all_to_all_bytes=_all_to_all_bytes(cfg, costs, layout, p, tokens),
        compiled=tuple(cfg.compile.components) if cfg.compile.enable else (),
        loss_chunk_tokens=chunk,
        peft=held.method,
        trainable=held.elements("trained"),
        frozen=held.elements("frozen", "nf4"),
        quantized=held.elements("nf4"),
        adapted_layers=held.adapted,
        nf4_embeddings=held.nf4_embeddings,
        frozen_dtype=held.frozen_dtype,
        frozen_bytes=frozen,
        gradients_at_peak=layout.micro_batches(training.global_batch_size) > 1 or pp > 1,
    )


def _trained_flops(flops: int, groups: tuple[tuple[ParamGroup, str], ...]) -> int:
    """``flops`` (forward and backward of a model whose every weight trains) for the weights that do:
    a frozen weight's gradient (2 FLOPs per weight and token) is never computed, an adapter's linear costs
    6 per weight and token. The frozen weights that multiply are the named linear layers and the output
    projection (the embedding when tied). The first block's projections of the frozen embedding's output
    also skip their input gradient; that is not subtracted (a block's share, under 5% of a debug model)."""
    if all(role == "trained" for _, role in groups):
        return flops
    frozen = sum(g.active_numel * g.copies for g, role in groups if role != "trained" and g.linears)
    kinds = {g.kind: g for g, _ in groups if not g.linears}
    head = kinds.get("output", kinds.get("embedding"))
    adapters = sum(g.active_numel * g.copies for g, role in groups if role == "trained")
    return flops - 2 * (frozen + (head.numel if head is not None else 0)) + 6 * adapters


def _all_to_all_bytes(cfg: "RunConfig", costs: ModelCosts, layout: Layout, p: int, tokens: int) -> int:
    """Bytes one rank sends in the experts' all-to-alls per optimizer step (uniform routing assumed).

    Per MoE layer and micro batch: each of the ``tokens x k`` routed copies of a token (``dim`` values in
    the compute dtype) leaves the rank with probability ``(ep - 1) / ep``, in the dispatch and the combine
    of the forward and again in the backward.
    """
    ep = layout.degrees.get("ep", 1)
    layers = getattr(costs, "expert_layers", None)
    k = max((g.experts_per_token or 0 for g in costs.parameters()), default=0)
    if ep == 1 or not callable(layers) or not k:
        return 0
    dim = next(g.shape[2] for g in costs.parameters() if g.experts_per_token is not None)
    per_layer = 4 * tokens * k * dim * p * (ep - 1) // ep
    return int(per_layer * layers() * layout.micro_batches(cfg.training.global_batch_size))


def layout_of(cfg: "RunConfig", world_size: int | None) -> Layout:
    """The config's own layout; with no world size every ``-1`` degree counts as 1 (an auto ``dp_shard``
    as ``ep``, the fewest ranks expert parallelism runs on)."""
    par = cfg.parallelism
    if world_size is None:  # an auto dp_shard under expert parallelism: the ep ranks it needs at least
        auto = {"dp_shard": par.ep}
        world_size = math.prod(
            getattr(par, k) if getattr(par, k) > 0 else auto.get(k, 1)
            for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp")
        )
    ac_cfg = cfg.activation_checkpoint
    ac: str | int = ac_cfg.mode
    if ac == "selective":
        ac = ac_cfg.selective_option
    return Layout(degrees=par.resolved_degrees(world_size), micro_batch=cfg.training.micro_batch_size, ac=ac)


def estimate(cfg: "RunConfig", world_size: int | None = None) -> Estimate | None:
    """Parameters, per-rank memory and FLOPs of ``cfg`` on ``world_size`` ranks (``None``: model offers none).

    ``world_size`` ``None`` takes each ``-1`` (auto) degree as 1.
    """
    costs = model_costs(cfg)
    if costs is None:
        return None
    return evaluate(cfg, costs, layout_of(cfg, world_size), world_size is not None)
