"""How long a run is, in steps and in epochs, as ``--dry-run`` can tell it before anything is loaded.

The trainer counts a run by ``training.epochs`` from its built data loader (``Trainer._build_length``); the
dry-run tells the same from what it may open without torch: a prepared folder's manifest and offsets
(``DatasetConfig.samples_per_epoch``). An in-memory source is tokenized only at launch, so its epochs are
said to be unknown rather than guessed. Importing this module imports no torch.
"""

from typing import TYPE_CHECKING

from hyper_parallel._checks import counted

if TYPE_CHECKING:
    from hyper_parallel.preflight.inputs import RunConfig

__all__ = ["run_length"]


def _data_parallel(cfg: "RunConfig", world_size: int | None) -> tuple[int, str]:
    """Data-parallel ranks of the run, and how they were counted."""
    par = cfg.parallelism
    if world_size is not None:
        degrees = par.resolved_degrees(world_size)
        return degrees["dp_replicate"] * degrees["dp_shard"], ""
    stated = max(par.dp_replicate, 1) * max(par.dp_shard, 1)
    auto = -1 in (par.dp_replicate, par.dp_shard)
    return stated, "; world size not given: each auto degree counted as 1" if auto else ""


def read_per_epoch(samples: int, dp: int, micro_batch_size: int, drop_last: bool) -> int:
    """Samples of an epoch of ``samples`` that ``dp`` ranks read together: each rank takes ``samples //
    dp`` (the rest of the epoch is left out), and ``drop_last`` drops a rank's short last micro-batch (the
    loader's rule, ``ResumableLoader.samples_per_epoch``)."""
    per_rank = samples // dp
    if drop_last:
        per_rank -= per_rank % micro_batch_size
    return dp * per_rank


def run_length(cfg: "RunConfig", world_size: int | None, *, files: bool) -> str:
    """One line: the run's steps and the epochs of data they read (``files``: the dry-run may open the
    files the config names; without, the epochs are not counted)."""
    training = cfg.training
    dataset = getattr(cfg.dataloader, "dataset", None)
    count = dataset.samples_per_epoch(training.seq_len) if files and dataset is not None else None
    if count is None:
        why = (
            "the files are not read (--no-file-checks)"
            if not files
            else f"the {getattr(dataset, 'source', None) or 'data'} source is only loaded at launch"
        )
        if training.max_steps is None:
            return f"length: {counted(training.epochs or 0, 'epoch')}, counted in steps at launch: {why}\n"
        told = counted(training.max_steps, "step")
        return f"length: {told}; the epochs they cover are counted at launch: {why}\n"
    dp, note = _data_parallel(cfg, world_size)
    drop_last = bool(getattr(cfg.dataloader, "drop_last", False))
    per_epoch = read_per_epoch(count, dp, training.micro_batch_size, drop_last)
    if per_epoch == 0:
        return f"length: the data holds {counted(count, 'sample')}, too few for {dp} data-parallel rank(s)\n"
    steps = training.steps_for(per_epoch)
    epochs = training.epochs_at(steps, per_epoch)
    given = f"training.epochs {training.epochs}" if training.max_steps is None else "training.max_steps"
    return (
        f"length: {counted(steps, 'step')} ({given}) x global batch {training.global_batch_size} = "
        f"{epochs:.4g} epochs of {counted(per_epoch, 'sample')} ({counted(count, 'sample')} at seq_len "
        f"{training.seq_len}, {counted(dp, 'data-parallel rank')}{note})\n"
    )
