"""Whether a run's loss is the fused, chunked cross entropy, and with how many tokens a chunk: one decision
that the resolver's refusals, the preflight's memory estimate and the trainer read alike.

``loss.chunk_tokens`` (``CausalLMLoss.Config``): ``0`` keeps the whole ``tokens x vocab`` logits (the output
projection in the model, the loss after it); a positive count fuses the projection into the loss and walks the
tokens that many at a time (``_chunked.py``), refused where the trainer cannot do it; unset (``null``, the
default) fuses with :data:`DEFAULT_CHUNK_TOKENS` wherever it can and keeps the whole logits elsewhere, and the
training banner says which and why. Where it cannot: a model whose forward takes no loss head, a
vision-language model (its trainer feeds images), tensor parallelism (the logits are sharded over the
vocabulary), an NF4 output weight (QLoRA's ``quantize_embeddings``), a pipeline (the last stage computes the
loss from logits), and a compiled loss (``compile.components`` holding ``loss`` compiles the whole-logits
loss, which inductor already fuses; the H200's compiled figures were measured with it).

Torch-free: imported by the config layer's rules and the preflight.
"""

from typing import Any, NamedTuple

__all__ = ["DEFAULT_CHUNK_TOKENS", "LossChunking", "loss_chunking"]

#: Tokens per chunk when ``loss.chunk_tokens`` is unset: at vocab 128,256 a chunk's float32 logits are
#: 0.5 GiB, and 1,024 rows keep the projection's matmuls large enough to run at full speed; on the CPU at
#: 2,048 tokens x vocab 128,256 x dim 256 the fused loss took 0.33x the memory and 0.35x the time of the
#: whole logits (``python -m bench loss``).
DEFAULT_CHUNK_TOKENS = 1024


class LossChunking(NamedTuple):
    """Tokens per chunk of the fused loss (0: the whole logits), why, and what refuses a stated count."""

    tokens: int
    reason: str
    #: ``(field path, message)`` when ``loss.chunk_tokens`` states a count this run cannot use.
    refusal: tuple[str, str] | None = None


def _blocker(cfg: Any, tp: int, pp: int) -> str | None:
    """The first thing that keeps this run from fusing the loss, said as a reason."""
    args = cfg.model.args
    if getattr(args, "vision", None) is not None:
        return "a vision-language model's trainer feeds images and projects the logits itself"
    if not args.fuses_loss_head():
        return f"{cfg.model.name!r}'s forward takes no loss head"
    if tp > 1:
        return f"tensor parallelism (tp {tp}) shards the logits over the vocabulary"
    if pp > 1:
        return f"pipeline parallelism (pp {pp}) computes the loss from the last stage's logits"
    if getattr(cfg.peft, "quantize_embeddings", False):
        return (
            "the output weight is stored as NF4 (peft.quantize_embeddings), which only its own linear reads"
        )
    if cfg.compile.enable and "loss" in cfg.compile.components:
        return "the compiled loss ('loss' in compile.components) takes the whole logits"
    return None


def loss_chunking(cfg: Any, tp: int = 1, pp: int = 1) -> LossChunking:
    """The loss of ``cfg`` (a ``TrainerConfig``) at tensor and pipeline degrees ``tp`` and ``pp``."""
    if not hasattr(cfg.loss, "chunk_tokens"):
        return LossChunking(0, f"{type(cfg.loss).__qualname__} has no chunk_tokens")
    stated = cfg.loss.chunk_tokens
    if stated == 0:
        return LossChunking(0, "loss.chunk_tokens is 0")
    blocker = _blocker(cfg, tp, pp)
    if blocker is None:
        tokens = DEFAULT_CHUNK_TOKENS if stated is None else int(stated)
        return LossChunking(tokens, "loss.chunk_tokens" if stated is not None else "the default")
    if stated is None:
        return LossChunking(0, blocker)
    message = f"cannot fuse the loss here: {blocker}; set it to 0 (or null) for the whole logits"
    return LossChunking(0, blocker, ("loss.chunk_tokens", message))
