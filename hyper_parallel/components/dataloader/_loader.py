"""Dealing, ordering and resuming batches: ``ResumableLoader`` and ``build_loader`` (part of ``DataLoader``).

Samples come from ``_samples`` (in-memory sources) or ``_prepared`` (memory-mapped folders), both cut from a
token corpus by ``_corpus``; this module deals them to the data-parallel ranks and batches them, one
micro-batch at a time (nothing per sample of the epoch is held). ``seq_len`` may not exceed the tokenizer's
``model_max_length``.

Order: position ``p`` of epoch ``e`` is sample ``order.indices(e, p)`` (``_order``: a computed per-epoch
shuffle, identity without ``shuffle``; several prepared sources blended by weight, each cycling its own
epochs).

- Training (``infinite``, or ``drop_last``): the first ``N - N % dp_world_size`` samples of that order are
  dealt round-robin (position ``p`` to rank ``p % dp_world_size``), so every rank sees the same number of
  disjoint samples, and each rank groups its share into micro-batches (``drop_last`` drops a short final
  one). For a global batch ``G``, the ``s``-th group of ``G`` samples taken by all ranks together is
  positions ``[s * G, (s + 1) * G)`` of the order whatever the data-parallel size and micro-batch size,
  so an optimizer step trains on the same samples (across epoch ends too when ``G`` divides ``N``).
- One pass (finite, no ``drop_last``: validation): all ``N`` samples are dealt the same way and every
  rank gets the same number of batches, a rank whose share runs out getting a filler batch (one sample
  whose labels are all ``ignore_index``: it counts no token), so models whose forward holds collectives
  (FSDP) run in step on every rank.

The position (epoch, batches consumed in it) is counted as batches are handed out, so ``state_dict`` /
``load_state_dict`` resume with exactly the next batch, whatever the worker processes had prefetched. A
position saved under another data-parallel size or micro-batch size is translated through the number of
samples consumed in the epoch (the same on every rank at an optimizer-step boundary), so a checkpoint
resumed on another layout trains on the same global batches; ``load_state_dict`` says when it cannot.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.utils.data

from hyper_parallel.components.dataloader._corpus import ConcatSamples, TokenIdError
from hyper_parallel.components.dataloader._order import SampleOrder
from hyper_parallel.components.dataloader._samples import Samples, WithFiller, collate_fn
from hyper_parallel.errors import InputFileError

if TYPE_CHECKING:
    from hyper_parallel.components.dataloader import DataLoader, DatasetConfig, LoaderRequest

__all__ = ["ResumableLoader", "build_loader"]


class _TooFewSamples(ValueError):
    """The samples do not fill one batch per data-parallel rank (a small or nearly empty dataset)."""


class _BatchSampler:
    """Index lists of the owning loader's remaining batches, read from its position when iterated."""

    def __init__(self, loader: ResumableLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[list[int]]:
        loader = self.loader
        epoch, index = loader._epoch, loader._batch_index
        while True:
            for batch in range(index, loader.batches_per_epoch):
                yield loader.batch(epoch, batch)
            if not loader.infinite:
                return
            epoch, index = epoch + 1, 0


def _pin(pin_memory: bool) -> bool:
    """Pinning helps only copies to an accelerator; without one torch would warn and do nothing."""
    return pin_memory and torch.accelerator.is_available()


class ResumableLoader:
    """Iterable of ``{input_ids, labels}`` batches of shape ``[micro_batch_size, seq_len]`` for one rank.

    (Batches of the ``shapes`` source also hold ``pixel_values`` and ``grid_thw``; see ``_samples``.)

    Iterating yields batches from the current position onwards: forever (epoch after epoch) when
    ``infinite``, else to the end of the current epoch. ``state_dict`` records the position. A finite
    loader without ``drop_last`` is one pass over every sample (see the module docstring).
    """

    def __init__(
        self,
        samples: Samples,
        request: LoaderRequest,
        *,
        seed: int,
        shuffle: bool,
        drop_last: bool,
        infinite: bool = True,
        workers: DataLoader.Config | None = None,
        weights: Sequence[float] | None = None,
        source_names: Sequence[str] = (),
    ) -> None:
        self.samples = samples
        sizes = [len(s) for s in samples.sources] if isinstance(samples, ConcatSamples) else [len(samples)]
        self.source_names = tuple(source_names)
        self.seq_len = request.seq_len
        self.dp_rank, self.dp_world_size = request.dp_rank, request.dp_world_size
        self.micro_batch_size, self.seed = request.micro_batch_size, seed
        self.shuffle, self.drop_last, self.infinite = shuffle, drop_last, infinite
        self.one_pass = not infinite and not drop_last
        micro_batch_size, dp_world_size = self.micro_batch_size, self.dp_world_size
        if self.one_pass:
            per_rank = -(-len(samples) // dp_world_size)
            self.batches_per_epoch = -(-per_rank // micro_batch_size)
        else:
            full, rest = divmod(len(samples) // dp_world_size, micro_batch_size)
            self.batches_per_epoch = full + (1 if rest and not drop_last else 0)
        if self.batches_per_epoch == 0:
            raise _TooFewSamples(
                f"the dataset has {len(samples)} samples: too few for one batch of {micro_batch_size} on "
                f"each of {dp_world_size} data-parallel ranks"
            )
        self.order = SampleOrder(sizes, weights, seed=seed, shuffle=shuffle)
        self._epoch = 0
        self._batch_index = 0
        num_workers = 0 if workers is None else workers.num_workers
        self._torch_loader = torch.utils.data.DataLoader(
            WithFiller(samples, request.ignore_index),
            batch_sampler=_BatchSampler(self),
            collate_fn=collate_fn(samples),
            num_workers=num_workers,
            pin_memory=workers is not None and _pin(workers.pin_memory),
            prefetch_factor=workers.prefetch_factor if workers is not None and num_workers > 0 else None,
            persistent_workers=workers is not None and workers.persistent_workers and num_workers > 0,
            # Its own generator for the workers' base seed: starting an iterator (as every resume does)
            # must not draw from the global torch RNG, or a resumed run's dropout masks would shift.
            generator=torch.Generator().manual_seed(seed),
        )

    def batch(self, epoch: int, index: int) -> list[int]:
        """Sample indices of this rank's micro-batch ``index`` of ``epoch`` (``[-1]``: a filler sample)."""
        n, world = len(self.samples), self.dp_world_size
        start = index * self.micro_batch_size
        positions = self.dp_rank + world * np.arange(start, start + self.micro_batch_size, dtype=np.int64)
        positions = positions[positions < (n if self.one_pass else n - n % world)]
        if positions.size == 0:
            return [WithFiller.FILLER]
        return [int(i) for i in self.order.indices(epoch, positions)]

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's micro-batches (sample indices; ``-1`` is a filler sample) of ``epoch``."""
        return [self.batch(epoch, index) for index in range(self.batches_per_epoch)]

    def data_tokens(self) -> dict[str, int]:
        """Tokens each source has supplied to all ranks so far, by name (the position's ``source_names``).

        Counted from the position alone (samples of ``seq_len`` tokens dealt before it), so it is the same
        on every rank and after a resume.
        """
        if not self.source_names:
            return {}
        used = self._samples_per_epoch(self.dp_world_size, self.micro_batch_size)
        step = self.dp_world_size * self.micro_batch_size
        totals = [0] * len(self.source_names)
        n = self.order.total
        ends = [(e * n, e * n + used) for e in range(self._epoch)]
        ends.append((self._epoch * n, self._epoch * n + min(self._batch_index * step, used)))
        for first, last in ends:
            for s, (a, b) in enumerate(zip(self.order.counts(first), self.order.counts(last), strict=True)):
                totals[s] += b - a
        return {name: count * self.seq_len for name, count in zip(self.source_names, totals, strict=True)}

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        batches = iter(self._torch_loader)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except TokenIdError as exc:  # found in this process or a worker: an input error, exit 2
                where, _, problem = exc.problem().partition(": ")
                raise InputFileError.at(where, problem) from None
            self._batch_index += 1
            if self._batch_index == self.batches_per_epoch:
                self._epoch, self._batch_index = self._epoch + 1, 0
            yield batch

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self.batches_per_epoch

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self._epoch

    @property
    def samples_per_epoch(self) -> int:
        """Samples of an epoch that all the ranks read together (``training.epochs`` counts steps by it)."""
        return self._samples_per_epoch(self.dp_world_size, self.micro_batch_size)

    def _identity(self) -> dict[str, int]:
        identity = {
            "dp_rank": self.dp_rank,
            "dp_world_size": self.dp_world_size,
            "micro_batch_size": self.micro_batch_size,
            "num_samples": len(self.samples),
            "seed": self.seed,
        }
        if len(self.order.sizes) > 1:  # a mixture: its sources' sizes and weights decide the order too
            identity["mixture"] = self.order.digest()
        return identity

    def state_dict(self) -> dict[str, int]:
        """The position (epoch, batches consumed in it) and what it depends on; plain ints only."""
        return {"epoch": self._epoch, "batch_index": self._batch_index, **self._identity()}

    def _samples_per_epoch(self, dp_world_size: int, micro_batch_size: int) -> int:
        """Samples of each epoch's order the training ranks of a layout consume together."""
        n = len(self.samples)
        full, rest = divmod(n // dp_world_size, micro_batch_size)
        per_rank = min(
            n // dp_world_size, micro_batch_size * (full + (1 if rest and not self.drop_last else 0))
        )
        return dp_world_size * per_rank

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position; the data must be the same, the layout may differ.

        A position saved by another data-parallel layout (``dp_world_size``, ``dp_rank``,
        ``micro_batch_size``) is read as the number of samples consumed in the epoch, which all ranks share
        at an optimizer-step boundary, and continues with the very samples the saved layout would have
        read next. That holds when both layouts consume the same samples per epoch (always when the global
        batch divides the number of samples) and the position falls on a micro-batch boundary of this
        layout; otherwise it is refused, as is any change of a one-pass (validation) loader.
        """
        identity = self._identity()
        data = [key for key in ("num_samples", "seed", "mixture") if key in identity or key in state]
        mismatched = {
            key: (state.get(key), identity.get(key)) for key in data if state.get(key) != identity.get(key)
        }
        if mismatched:
            detail = ", ".join(f"{k}: saved {old!r}, now {new!r}" for k, (old, new) in mismatched.items())
            raise ValueError(f"cannot resume the data position: {detail}")
        epoch, index = int(state["epoch"]), int(state["batch_index"])
        if any(state.get(key) != identity[key] for key in ("dp_rank", "dp_world_size", "micro_batch_size")):
            index = self._translated(state, index)
        if epoch < 0 or not 0 <= index < self.batches_per_epoch:
            raise ValueError(f"invalid data position: epoch {epoch}, batch {index}")
        self._epoch, self._batch_index = epoch, index

    def _translated(self, state: dict[str, Any], index: int) -> int:
        """This layout's batch index at the position ``state`` saved under another layout (or refuse)."""
        world, size = int(state["dp_world_size"]), int(state["micro_batch_size"])
        saved = f"{world} data-parallel rank(s) x micro-batch {size}"
        now = f"{self.dp_world_size} x {self.micro_batch_size}"
        if self.one_pass:
            raise ValueError(f"cannot resume a one-pass data position saved with {saved} on {now}")
        before = self._samples_per_epoch(world, size)
        after = self._samples_per_epoch(self.dp_world_size, self.micro_batch_size)
        if before != after:
            raise ValueError(
                f"cannot resume the data position saved with {saved} on {now}: an epoch of "
                f"{len(self.samples)} samples is cut to {before} samples by the saved layout and to {after} "
                "by this one, so the batches after this epoch would differ; resume with the saved layout, or "
                "train on a number of samples that training.global_batch_size divides"
            )
        consumed, step = index * world * size, self.dp_world_size * self.micro_batch_size
        if consumed % step:
            raise ValueError(
                f"cannot resume the data position saved with {saved} on {now}: {consumed} samples of the "
                f"epoch are consumed, not a whole number of this layout's {step}-sample rounds"
            )
        return consumed // step


def build_loader(
    dataset: DatasetConfig,
    request: LoaderRequest,
    *,
    shuffle: bool,
    drop_last: bool,
    infinite: bool,
    max_samples: int | None = None,
    workers: DataLoader.Config | None = None,
) -> ResumableLoader:
    """Read, tokenize and pack ``dataset`` into a ``ResumableLoader`` for the request's rank.

    ``max_samples`` caps the samples below ``dataset.max_samples``; the request's ``process_group`` shares
    the tokenizing among its members (``_tokenizing``). ``workers`` (a data loader's Config) gives the
    worker-process and pinning options; None loads in this process.

    The tokenizer's own ``model_max_length`` (read from its files, which resolving never opens) must not be
    below ``seq_len``: checked here, since only the built tokenizer knows it.
    """
    longest = getattr(request.tokenizer, "model_max_length", None)
    if isinstance(longest, int) and request.seq_len > longest:
        raise ValueError(
            f"training.seq_len {request.seq_len} exceeds the tokenizer's model_max_length {longest}; raise "
            "tokenizer.model_max_length if the model takes longer sequences"
        )
    caps = [cap for cap in (dataset.max_samples, max_samples) if cap is not None]
    seed = dataset.seed if dataset.seed is not None else request.seed
    samples = dataset.samples(request, seed=seed, max_samples=min(caps) if caps else None)
    weights, names = dataset.mixture()
    try:
        return ResumableLoader(
            samples,
            request,
            seed=seed,
            shuffle=shuffle,
            drop_last=drop_last,
            infinite=infinite,
            workers=workers,
            weights=weights,
            source_names=names,
        )
    except _TooFewSamples as exc:
        if not dataset.files():
            raise
        raise InputFileError.at(", ".join(dataset.files()), str(exc)) from None
