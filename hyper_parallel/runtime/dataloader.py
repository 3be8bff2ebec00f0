"""Runtime of ``hyper_parallel.components.dataloader``: packed causal-LM batches with a resumable position.

Imported only from ``DataLoader.Config.build``; this module imports torch.

Sources (``dataset.source``):

- ``jsonl``: one JSON object per line, the document is ``obj[text_field]``; blank lines are skipped.
- ``text``: each file is one document.
- ``synthetic``: ``synthetic_num_samples`` windows of uniform random token ids (reproducible per index).

A path may be a file or a directory (searched recursively, sorted: ``*.jsonl`` for ``jsonl``, ``*.txt``
for ``text``). Documents are tokenized once, in the training process, and kept in memory.

With ``pack_sequences`` every document ends with EOS and the documents are concatenated and cut into
windows of ``seq_len`` tokens (the incomplete tail is dropped); otherwise each document is one sample,
cut or right-padded with the pad id (padded labels are ``ignore_index``). ``labels`` is aligned with
``input_ids`` (the loss shifts). ``max_samples`` keeps the first samples.

Order: epoch ``e`` permutes the samples with a generator seeded from ``(seed, e)`` (identity without
``shuffle``); the first ``N - N % dp_world_size`` samples of that order are dealt round-robin, so every
rank sees the same number of disjoint samples, and each rank groups its share into micro-batches
(``drop_last`` drops a short final one). The position (epoch, batches consumed in it) is counted as
batches are handed out, so ``state_dict`` / ``load_state_dict`` resume with exactly the next batch,
whatever the worker processes had prefetched.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.utils.data

if TYPE_CHECKING:
    from hyper_parallel.components.dataloader import DatasetConfig

__all__ = ["ResumableLoader", "build_loader", "read_documents"]

_SUFFIX = {"jsonl": ".jsonl", "text": ".txt"}
_TOKENIZE_CHUNK = 1024


def _files(paths: Sequence[str], source: str) -> list[Path]:
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(
                sorted(
                    p
                    for p in path.rglob(f"*{_SUFFIX[source]}")
                    if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
                )
            )
        elif path.is_file():
            found.append(path)
        else:
            raise FileNotFoundError(f"dataset path {raw!r} is neither a file nor a directory")
    if not found:
        raise FileNotFoundError(f"no {_SUFFIX[source]} file under {list(paths)!r}")
    return found


def read_documents(cfg: DatasetConfig) -> Iterator[str]:
    """The documents of a ``jsonl`` or ``text`` dataset, in file order."""
    for file in _files(cfg.paths, cfg.source):
        if cfg.source == "text":
            yield file.read_text(encoding="utf-8")
            continue
        with file.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{file}:{number}: not a JSON object: {exc.msg}") from None
                if not isinstance(record, dict) or not isinstance(record.get(cfg.text_field), str):
                    raise ValueError(f"{file}:{number}: no string field {cfg.text_field!r}")
                yield record[cfg.text_field]


def _tokenize(tokenizer: Any, documents: Iterator[str]) -> Iterator[list[int]]:
    batch: list[str] = []
    encode_batch = getattr(tokenizer, "encode_batch", None)
    for doc in documents:
        batch.append(doc)
        if len(batch) == _TOKENIZE_CHUNK:
            yield from encode_batch(batch) if encode_batch else map(tokenizer.encode, batch)
            batch = []
    if batch:
        yield from encode_batch(batch) if encode_batch else map(tokenizer.encode, batch)


class _Samples(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Map-style samples ``{input_ids, labels}`` of ``seq_len`` tokens."""

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class _PackedSamples(_Samples):
    def __init__(self, stream: torch.Tensor, seq_len: int, count: int) -> None:
        self.stream, self.seq_len, self.count = stream, seq_len, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        window = self.stream[index * self.seq_len : (index + 1) * self.seq_len].long()
        return {"input_ids": window, "labels": window.clone()}


class _PaddedSamples(_Samples):
    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        self.inputs, self.labels = inputs, labels

    def __len__(self) -> int:
        return int(self.inputs.size(0))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.inputs[index].long(), "labels": self.labels[index].long()}


class _SyntheticSamples(_Samples):
    def __init__(self, count: int, seq_len: int, vocab_size: int, seed: int) -> None:
        self.count, self.seq_len, self.vocab_size, self.seed = count, seq_len, vocab_size, seed

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        ids = torch.randint(0, self.vocab_size, (self.seq_len,), generator=gen)
        return {"input_ids": ids, "labels": ids.clone()}


def _samples(cfg: DatasetConfig, tokenizer: Any, seq_len: int, seed: int, ignore_index: int) -> _Samples:
    if cfg.source == "synthetic":
        vocab = getattr(tokenizer, "vocab_size", None)
        if not isinstance(vocab, int) or vocab < 1:
            raise ValueError("the synthetic source needs a tokenizer with a positive vocab_size")
        count = cfg.synthetic_num_samples
        if cfg.max_samples is not None:
            count = min(count, cfg.max_samples)
        return _SyntheticSamples(count, seq_len, vocab, seed)
    docs = _tokenize(tokenizer, read_documents(cfg))
    if cfg.pack_sequences:
        eos = getattr(tokenizer, "eos_id", None)
        if eos is None:
            raise ValueError("packing documents needs a tokenizer with an eos token")
        pieces: list[torch.Tensor] = []
        total = 0
        limit = None if cfg.max_samples is None else cfg.max_samples * seq_len
        for ids in docs:
            if not ids or ids[-1] != eos:
                ids = [*ids, eos]
            pieces.append(torch.tensor(ids, dtype=torch.int64))
            total += len(ids)
            if limit is not None and total >= limit:
                break
        stream = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int64)
        count = stream.numel() // seq_len
        if cfg.max_samples is not None:
            count = min(count, cfg.max_samples)
        return _PackedSamples(stream, seq_len, count)
    pad = getattr(tokenizer, "pad_id", None)
    if pad is None:
        raise ValueError("padding documents (pack_sequences: false) needs a tokenizer with a pad token")
    rows: list[list[int]] = []
    masks: list[int] = []
    for ids in docs:
        ids = ids[:seq_len]
        masks.append(len(ids))
        rows.append(ids + [pad] * (seq_len - len(ids)))
        if cfg.max_samples is not None and len(rows) >= cfg.max_samples:
            break
    inputs = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), seq_len)
    labels = inputs.clone()
    for row, length in enumerate(masks):
        labels[row, length:] = ignore_index
    return _PaddedSamples(inputs, labels)


class _BatchSampler:
    """Index lists of the owning loader's remaining batches, read from its position when iterated."""

    def __init__(self, loader: ResumableLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[list[int]]:
        loader = self.loader
        epoch, index = loader._epoch, loader._batch_index
        while True:
            batches = loader.epoch_batches(epoch)
            yield from batches[index:]
            if not loader.infinite:
                return
            epoch, index = epoch + 1, 0


class ResumableLoader:
    """Iterable of ``{input_ids, labels}`` batches of shape ``[micro_batch_size, seq_len]`` for one rank.

    Iterating yields batches from the current position onwards: forever (epoch after epoch) when
    ``infinite``, else to the end of the current epoch. ``state_dict`` records the position.
    """

    def __init__(
        self,
        samples: _Samples,
        *,
        dp_rank: int,
        dp_world_size: int,
        micro_batch_size: int,
        seed: int,
        shuffle: bool,
        drop_last: bool,
        infinite: bool = True,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
    ) -> None:
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank must be in [0, {dp_world_size}), got {dp_rank}")
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.samples = samples
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self.micro_batch_size, self.seed = micro_batch_size, seed
        self.shuffle, self.drop_last, self.infinite = shuffle, drop_last, infinite
        per_rank = len(samples) // dp_world_size
        full, rest = divmod(per_rank, micro_batch_size)
        self.batches_per_epoch = full + (1 if rest and not drop_last else 0)
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"the dataset has {len(samples)} samples: too few for one batch of {micro_batch_size} on "
                f"each of {dp_world_size} data-parallel ranks"
            )
        self._epoch = 0
        self._batch_index = 0
        self._torch_loader = torch.utils.data.DataLoader(
            samples,
            batch_sampler=_BatchSampler(self),
            num_workers=num_workers,
            pin_memory=pin_memory and torch.cuda.is_available(),
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            persistent_workers=persistent_workers and num_workers > 0,
            # Its own generator for the workers' base seed: starting an iterator (as every resume does)
            # must not draw from the global torch RNG, or a resumed run's dropout masks would shift.
            generator=torch.Generator().manual_seed(seed),
        )

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's micro-batches (sample indices) of ``epoch``."""
        n = len(self.samples)
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            order = torch.randperm(n, generator=gen).tolist()
        else:
            order = list(range(n))
        mine = order[self.dp_rank : n - n % self.dp_world_size : self.dp_world_size]
        size = self.micro_batch_size
        return [mine[i : i + size] for i in range(0, size * self.batches_per_epoch, size)]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for batch in self._torch_loader:
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

    def _identity(self) -> dict[str, int]:
        return {
            "dp_rank": self.dp_rank,
            "dp_world_size": self.dp_world_size,
            "micro_batch_size": self.micro_batch_size,
            "num_samples": len(self.samples),
            "seed": self.seed,
        }

    def state_dict(self) -> dict[str, int]:
        """The position (epoch, batches consumed in it) and what it depends on; plain ints only."""
        return {"epoch": self._epoch, "batch_index": self._batch_index, **self._identity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position; the data, sharding and batch size must be the same."""
        mismatched = {
            key: (state.get(key), value) for key, value in self._identity().items() if state.get(key) != value
        }
        if mismatched:
            detail = ", ".join(f"{k}: saved {old!r}, now {new!r}" for k, (old, new) in mismatched.items())
            raise ValueError(f"cannot resume the data position: {detail}")
        epoch, index = int(state["epoch"]), int(state["batch_index"])
        if epoch < 0 or not 0 <= index < self.batches_per_epoch:
            raise ValueError(f"invalid data position: epoch {epoch}, batch {index}")
        self._epoch, self._batch_index = epoch, index


def build_loader(
    dataset: DatasetConfig,
    tokenizer: Any,
    *,
    dp_rank: int,
    dp_world_size: int,
    seq_len: int,
    micro_batch_size: int,
    seed: int,
    shuffle: bool,
    drop_last: bool,
    infinite: bool,
    ignore_index: int = -100,
    num_workers: int = 0,
    pin_memory: bool = False,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
) -> ResumableLoader:
    """Read, tokenize and pack ``dataset`` into a ``ResumableLoader`` for one data-parallel rank."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    effective_seed = dataset.seed if dataset.seed is not None else seed
    return ResumableLoader(
        _samples(dataset, tokenizer, seq_len, effective_seed, ignore_index),
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        micro_batch_size=micro_batch_size,
        seed=effective_seed,
        shuffle=shuffle,
        drop_last=drop_last,
        infinite=infinite,
        num_workers=num_workers,
        pin_memory=pin_memory,
        prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers,
    )
