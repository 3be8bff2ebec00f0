"""Runtime of ``hyper_parallel.components.dataloader``: packed causal-LM batches with a resumable position.

Imported only from ``DataLoader.Config.build``; this module imports torch.

Sources (``dataset.source``):

- ``jsonl``: one JSON object per line, the document is ``obj[text_field]``; blank lines are skipped.
- ``text``: each file is one document.
- ``python_docs``: the docstrings of a fixed list of standard-library modules (``python_docs()``): about
  450 KB of English prose and code in some 1,600 documents, on every machine, without files or network.
- ``synthetic``: ``synthetic_num_samples`` windows of uniform random token ids (reproducible per index).
- ``shapes``: ``synthetic_num_samples`` captioned images of coloured shapes for vision-language models
  (``_images``; reproducible per index, drawn when a batch is loaded). Sample ``i`` is
  ``[bos] + [image_token_id] * merged_tokens + caption + [eos]`` (bos/eos as the tokenizer adds them),
  cut or right-padded to ``seq_len``, with labels ``ignore_index`` on the image placeholders and the
  padding, plus ``pixel_values`` (the image's patch rows) and ``grid_thw`` (``[1, h, w]``). Every image has
  the same size, so a batch of ``B`` samples is ``input_ids``/``labels`` ``[B, seq_len]``,
  ``pixel_values`` ``[B * patches, patch_dim]`` (concatenated in sample order) and ``grid_thw``
  ``[B, 3]``. It needs the model's vision arguments and image token id; ``process_group`` is not used
  (the 270 captions are encoded by every rank).

A path may be a file or a directory (searched recursively, sorted: ``*.jsonl`` for ``jsonl``, ``*.txt``
for ``text``). Documents are tokenized once, at build time, and kept in memory.

Shared tokenizing: with a ``process_group`` of ``n`` ranks, every member reads the same documents and
takes them in rounds of ``n * 1024``; in each round, the document at position ``i`` of the whole dataset
is encoded by the member of group rank ``i % n`` only, and the round's token lists are all-gathered, so
every member ends with every document's tokens in document order: exactly what one process would
encode alone. Everything after (packing, sample order, dealing) is computed from that identical stream,
so the samples of a step do not depend on the group or on the data-parallel size. Every member must
build the same dataset with the same tokenizer at the same point; any group whose members need the same
stream works (the whole world, or the data-parallel group). Without a group each process encodes all.

With ``pack_sequences`` every document ends with EOS and the documents are concatenated and cut into
windows of ``seq_len`` tokens (the incomplete tail is dropped); otherwise each document is one sample,
cut or padded with the pad id on the tokenizer's ``padding_side`` (padded labels are ``ignore_index``).
``labels`` is aligned with ``input_ids`` (the loss shifts). ``max_samples`` keeps the first samples;
``seq_len`` may not exceed the tokenizer's ``model_max_length``.

Order: epoch ``e`` permutes the samples with a generator seeded from ``(seed, e)`` (identity without
``shuffle``).

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

import array
import functools
import importlib
import inspect
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.distributed as dist
import torch.utils.data

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from hyper_parallel.components.dataloader import DatasetConfig
    from hyper_parallel.components.dataloader._images import ShapeImages

__all__ = ["ResumableLoader", "build_loader", "python_docs", "read_documents"]

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


# Pure-library modules whose import only defines names (no threads, no I/O, no GUI, no easter eggs),
# present in CPython 3.10-3.13. Their docstrings change a little between versions; their kind does not.
_PYTHON_DOCS_MODULES = (
    *("abc", "argparse", "base64", "bisect", "calendar", "collections", "contextlib", "copy", "csv"),
    *("dataclasses", "datetime", "decimal", "difflib", "enum", "fnmatch", "fractions", "functools"),
    *("gettext", "glob", "graphlib", "gzip", "hashlib", "heapq", "hmac", "html", "inspect", "io"),
    *("ipaddress", "itertools", "json", "keyword", "linecache", "locale", "logging", "math", "numbers"),
    *("operator", "os", "pathlib", "pickle", "pprint", "queue", "random", "re", "reprlib", "sched"),
    *("secrets", "selectors", "shlex", "shutil", "socket", "statistics", "string", "struct"),
    *("subprocess", "tempfile", "textwrap", "threading", "time", "timeit", "tokenize", "traceback"),
    *("types", "typing", "urllib.parse", "uuid", "warnings", "weakref", "zipfile", "zlib"),
)


def _documented(prefix: str, obj: object) -> Iterator[str]:
    doc = getattr(obj, "__doc__", None)
    if isinstance(doc, str) and doc.strip():
        yield f"{prefix}\n\n{inspect.cleandoc(doc)}\n"


def _defined_in(member: object, homes: set[str]) -> bool:
    """A method or property written in the class's own module: not one another library patched in.

    (transformers, for one, adds methods to ``logging.Logger``; methods of C types have no module.)
    """
    if isinstance(member, property):
        member = member.fget
    elif isinstance(member, (classmethod, staticmethod)):
        member = member.__func__
    if not inspect.isroutine(member):
        return False
    module = getattr(member, "__module__", None)
    return module is None or module in homes


def _module_docs(name: str) -> Iterator[str]:
    """The module's docstring, then each public class or function it defines, then their methods."""
    module = importlib.import_module(name)
    yield from _documented(name, module)
    homes = {name, f"_{name.rpartition('.')[2]}"}  # C accelerators report themselves as _name
    for attr in sorted(getattr(module, "__all__", None) or dir(module)):
        obj = getattr(module, attr, None)
        if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if getattr(obj, "__module__", None) not in homes:
            continue  # imported from elsewhere: documented there, if at all
        yield from _documented(f"{name}.{attr}", obj)
        if inspect.isclass(obj):
            for member, value in sorted(vars(obj).items()):
                if not member.startswith("_") and _defined_in(value, homes):
                    yield from _documented(f"{name}.{attr}.{member}", value)


@functools.cache
def python_docs() -> tuple[str, ...]:
    """Docstrings of the standard library, one document per module, class, function or method.

    Each document is its dotted name, a blank line and the cleaned docstring, in a fixed order (modules as
    listed, names sorted). Collected from the running interpreter, so nothing is read from disk beyond
    the imports (about 0.15 s when the modules are not imported yet) and nothing from the network. A
    module this interpreter lacks is skipped.
    """
    docs: list[str] = []
    for name in _PYTHON_DOCS_MODULES:
        try:
            docs.extend(_module_docs(name))
        except ImportError:
            continue
    return tuple(docs)


def read_documents(cfg: DatasetConfig) -> Iterator[str]:
    """The documents of a ``jsonl``, ``text`` or ``python_docs`` dataset, in file (or listed) order."""
    if cfg.source == "python_docs":
        yield from python_docs()
        return
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


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    encode_batch = getattr(tokenizer, "encode_batch", None)
    return list(encode_batch(texts)) if encode_batch else [tokenizer.encode(text) for text in texts]


class _Share(NamedTuple):
    """One member's part of a tokenizing round, as all-gathered: compact bytes, or what went wrong."""

    documents: int  # read in this round by this member (all members must agree)
    ids: bytes  # array("q") of the encoded documents' tokens, concatenated
    lengths: bytes  # array("q") of their lengths
    error: str | None


def _share(tokenizer: Any, documents: Iterator[str], rank: int, size: int) -> _Share:
    """Read the round's documents (every member reads all) and encode this member's every ``size``-th."""
    try:
        chunk = list(itertools.islice(documents, size * _TOKENIZE_CHUNK))
        encoded = _encode(tokenizer, chunk[rank::size])
    except Exception as exc:  # every member must learn of it, or the others wait forever
        return _Share(0, b"", b"", f"{type(exc).__name__}: {exc}")
    ids = array.array("q", (token for doc in encoded for token in doc))
    return _Share(len(chunk), ids.tobytes(), array.array("q", map(len, encoded)).tobytes(), None)


def _unpack(share: _Share) -> list[list[int]]:
    flat, sizes = array.array("q", share.ids).tolist(), array.array("q", share.lengths).tolist()
    out, start = [], 0
    for size in sizes:
        out.append(flat[start : start + size])
        start += size
    return out


def _tokenize(tokenizer: Any, documents: Iterator[str], group: ProcessGroup | None) -> Iterator[list[int]]:
    """Token ids of every document, in order; a group shares the encoding (see the module docstring).

    A member that cannot read or encode its round, or that read a different number of documents than
    the others, makes every member raise at the same round instead of leaving the others waiting.
    """
    size = 1 if group is None else dist.get_world_size(group)
    if size == 1:
        while chunk := list(itertools.islice(documents, _TOKENIZE_CHUNK)):
            yield from _encode(tokenizer, chunk)
        return
    rank = dist.get_rank(group)
    while True:
        shares: list[Any] = [None] * size
        dist.all_gather_object(shares, _share(tokenizer, documents, rank, size), group=group)
        for member, share in enumerate(shares):
            if share.error is not None:
                raise ValueError(f"rank {member} of the data group could not read or tokenize: {share.error}")
        counts = [share.documents for share in shares]
        if len(set(counts)) > 1:
            raise ValueError(
                f"the ranks of the data group read different documents ({counts} in one round): every rank "
                "must see the same dataset"
            )
        encoded = [_unpack(share) for share in shares]
        for i in range(counts[0]):
            yield encoded[i % size][i // size]
        if counts[0] < size * _TOKENIZE_CHUNK:
            return


class _Samples(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Map-style samples ``{input_ids, labels}`` of ``seq_len`` tokens."""

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class _PackedSamples(_Samples):
    def __init__(self, stream: torch.Tensor, seq_len: int, count: int, eos: int | None) -> None:
        self.stream, self.seq_len, self.count, self.eos = stream, seq_len, count, eos

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        window = self.stream[index * self.seq_len : (index + 1) * self.seq_len].long()
        sample = {"input_ids": window, "labels": window.clone()}
        if self.eos is not None:
            # A document ends with its EOS: the document of token t counts the EOS tokens before t.
            ends = (window == self.eos).long()
            sample["document_ids"] = ends.cumsum(0) - ends
        return sample


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


class _ShapesSamples(_Samples):
    """Captioned shape images (``_images``), drawn when a sample is loaded."""

    def __init__(
        self,
        images: ShapeImages,
        captions: dict[str, tuple[list[int], list[int]]],
        *,
        count: int,
        seq_len: int,
        image_token_id: int,
        pad_id: int,
        ignore_index: int,
    ) -> None:
        self.images, self.captions, self.count, self.seq_len = images, captions, count, seq_len
        self.image_token_id, self.pad_id, self.ignore_index = image_token_id, pad_id, ignore_index
        self.grid_thw = torch.tensor(images.grid_thw, dtype=torch.int64)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        caption, image = self.images.draw(index)
        head, body = self.captions[caption]
        ids = [*head, *[self.image_token_id] * self.images.merged_tokens, *body][: self.seq_len]
        fill = self.seq_len - len(ids)
        input_ids = torch.tensor(ids + [self.pad_id] * fill, dtype=torch.int64)
        labels = input_ids.clone()
        labels[input_ids == self.image_token_id] = self.ignore_index
        labels[len(ids) :] = self.ignore_index
        return {
            "input_ids": input_ids,
            "labels": labels,
            "pixel_values": self.images.patches(image),
            "grid_thw": self.grid_thw.clone(),
        }


def _collate_images(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack the samples' tensors, except ``pixel_values``: each sample's patch rows, concatenated."""
    return {
        key: (torch.cat if key == "pixel_values" else torch.stack)([sample[key] for sample in samples])
        for key in samples[0]
    }


def _shapes(
    tokenizer: Any,
    *,
    vision: Any,
    image_token_id: int | None,
    seq_len: int,
    seed: int,
    count: int,
    ignore_index: int,
) -> _ShapesSamples:
    if vision is None or image_token_id is None:
        raise ValueError(
            "the shapes source needs a vision-language model: build the data loader with the model's vision "
            "arguments (vision=) and image placeholder id (image_token_id=)"
        )
    from hyper_parallel.components.dataloader._images import ShapeImages

    images = ShapeImages(vision, seed)
    names = ShapeImages.captions()
    bos = getattr(tokenizer, "bos_id", None)
    pad = getattr(tokenizer, "pad_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_id", None)
    captions: dict[str, tuple[list[int], list[int]]] = {}
    for name, ids in zip(names, _encode(tokenizer, names), strict=True):
        if image_token_id in ids or image_token_id == pad:
            raise ValueError(
                "the tokenizer encodes or pads the shapes captions with the image token id "
                f"{image_token_id}: set the model's image_token_id to an id the tokenizer never produces"
            )
        head = ids[:1] if bos is not None and ids[:1] == [bos] else []
        captions[name] = (head, ids[len(head) :])
    shortest = max(len(head) for head, _ in captions.values()) + images.merged_tokens + 1
    if seq_len < shortest:
        raise ValueError(
            f"training.seq_len {seq_len} is too short for the shapes source: an image takes "
            f"{images.merged_tokens} tokens, so seq_len must be at least {shortest}"
        )
    return _ShapesSamples(
        images,
        captions,
        count=count,
        seq_len=seq_len,
        image_token_id=image_token_id,
        pad_id=0 if pad is None else pad,
        ignore_index=ignore_index,
    )


class _WithFiller(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """``samples``, plus index ``FILLER``: sample 0 with every label ``ignore_index`` (counts no token)."""

    FILLER = -1

    def __init__(self, samples: _Samples, ignore_index: int) -> None:
        self.samples, self.ignore_index = samples, ignore_index

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index != self.FILLER:
            return self.samples[index]
        sample = self.samples[0]
        return {**sample, "labels": torch.full_like(sample["labels"], self.ignore_index)}


def _packed(
    docs: Iterator[list[int]], eos: int, seq_len: int, max_samples: int | None, document_masking: bool
) -> _Samples:
    pieces: list[torch.Tensor] = []
    total = 0
    limit = None if max_samples is None else max_samples * seq_len
    for ids in docs:
        if not ids or ids[-1] != eos:
            ids = [*ids, eos]
        pieces.append(torch.tensor(ids, dtype=torch.int64))
        total += len(ids)
        if limit is not None and total >= limit:
            break
    stream = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int64)
    count = stream.numel() // seq_len
    if max_samples is not None:
        count = min(count, max_samples)
    return _PackedSamples(stream, seq_len, count, eos if document_masking else None)


def _padded(
    docs: Iterator[list[int]], tokenizer: Any, seq_len: int, max_samples: int | None, ignore_index: int
) -> _Samples:
    pad = getattr(tokenizer, "pad_id", None)
    if pad is None:
        raise ValueError("padding documents (pack_sequences: false) needs a tokenizer with a pad token")
    left = getattr(tokenizer, "padding_side", "right") == "left"
    inputs: list[list[int]] = []
    labels: list[list[int]] = []
    for ids in docs:
        ids = ids[:seq_len]
        fill = seq_len - len(ids)
        inputs.append([pad] * fill + ids if left else ids + [pad] * fill)
        labels.append([ignore_index] * fill + ids if left else ids + [ignore_index] * fill)
        if max_samples is not None and len(inputs) >= max_samples:
            break
    shape = (len(inputs), seq_len)
    as_tensor = functools.partial(torch.tensor, dtype=torch.int64)
    return _PaddedSamples(as_tensor(inputs).reshape(shape), as_tensor(labels).reshape(shape))


def _samples(
    cfg: DatasetConfig,
    tokenizer: Any,
    *,
    seq_len: int,
    seed: int,
    ignore_index: int,
    max_samples: int | None,
    group: ProcessGroup | None,
    vision: Any = None,
    image_token_id: int | None = None,
) -> _Samples:
    if cfg.source == "shapes":
        count = cfg.synthetic_num_samples
        return _shapes(
            tokenizer,
            vision=vision,
            image_token_id=image_token_id,
            seq_len=seq_len,
            seed=seed,
            count=count if max_samples is None else min(count, max_samples),
            ignore_index=ignore_index,
        )
    if cfg.source == "synthetic":
        vocab = getattr(tokenizer, "vocab_size", None)
        if not isinstance(vocab, int) or vocab < 1:
            raise ValueError("the synthetic source needs a tokenizer with a positive vocab_size")
        count = cfg.synthetic_num_samples
        return _SyntheticSamples(
            count if max_samples is None else min(count, max_samples), seq_len, vocab, seed
        )
    docs = _tokenize(tokenizer, read_documents(cfg), group)
    try:
        if cfg.pack_sequences:
            eos = getattr(tokenizer, "eos_id", None)
            if eos is None:
                raise ValueError("packing documents needs a tokenizer with an eos token")
            return _packed(docs, eos, seq_len, max_samples, cfg.document_masking)
        return _padded(docs, tokenizer, seq_len, max_samples, ignore_index)
    finally:
        docs.close()  # type: ignore[attr-defined]


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


def _pin(pin_memory: bool) -> bool:
    """Pinning helps only copies to an accelerator; without one torch would warn and do nothing."""
    return pin_memory and torch.accelerator.is_available()


class ResumableLoader:
    """Iterable of ``{input_ids, labels}`` batches of shape ``[micro_batch_size, seq_len]`` for one rank.

    (Batches of the ``shapes`` source also hold ``pixel_values`` and ``grid_thw``; module docstring.)

    Iterating yields batches from the current position onwards: forever (epoch after epoch) when
    ``infinite``, else to the end of the current epoch. ``state_dict`` records the position. A finite
    loader without ``drop_last`` is one pass over every sample (see the module docstring).
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
        ignore_index: int = -100,
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
        self.one_pass = not infinite and not drop_last
        if self.one_pass:
            per_rank = -(-len(samples) // dp_world_size)
            self.batches_per_epoch = -(-per_rank // micro_batch_size)
        else:
            full, rest = divmod(len(samples) // dp_world_size, micro_batch_size)
            self.batches_per_epoch = full + (1 if rest and not drop_last else 0)
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"the dataset has {len(samples)} samples: too few for one batch of {micro_batch_size} on "
                f"each of {dp_world_size} data-parallel ranks"
            )
        self._epoch = 0
        self._batch_index = 0
        collate: Callable[[list[dict[str, torch.Tensor]]], dict[str, torch.Tensor]] | None = (
            _collate_images if isinstance(samples, _ShapesSamples) else None
        )
        self._torch_loader = torch.utils.data.DataLoader(
            _WithFiller(samples, ignore_index),
            batch_sampler=_BatchSampler(self),
            collate_fn=collate,
            num_workers=num_workers,
            pin_memory=_pin(pin_memory),
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            persistent_workers=persistent_workers and num_workers > 0,
            # Its own generator for the workers' base seed: starting an iterator (as every resume does)
            # must not draw from the global torch RNG, or a resumed run's dropout masks would shift.
            generator=torch.Generator().manual_seed(seed),
        )

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's micro-batches (sample indices; ``-1`` is a filler sample) of ``epoch``."""
        n = len(self.samples)
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            order = torch.randperm(n, generator=gen).tolist()
        else:
            order = list(range(n))
        size = self.micro_batch_size
        if self.one_pass:
            mine = order[self.dp_rank :: self.dp_world_size]
            batches = [mine[i : i + size] for i in range(0, len(mine), size)]
            return batches + [[_WithFiller.FILLER]] * (self.batches_per_epoch - len(batches))
        mine = order[self.dp_rank : n - n % self.dp_world_size : self.dp_world_size]
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
        data = ("num_samples", "seed")
        identity = self._identity()
        mismatched = {key: (state.get(key), identity[key]) for key in data if state.get(key) != identity[key]}
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
    max_samples: int | None = None,
    num_workers: int = 0,
    pin_memory: bool = False,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    process_group: ProcessGroup | None = None,
    vision: Any = None,
    image_token_id: int | None = None,
) -> ResumableLoader:
    """Read, tokenize and pack ``dataset`` into a ``ResumableLoader`` for one data-parallel rank.

    ``max_samples`` caps the samples below ``dataset.max_samples``; ``process_group`` shares the
    tokenizing among its members (module docstring). ``vision`` (the model's vision arguments) and
    ``image_token_id`` are read by the ``shapes`` source only, which needs them.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    longest = getattr(tokenizer, "model_max_length", None)
    if isinstance(longest, int) and seq_len > longest:
        raise ValueError(
            f"training.seq_len {seq_len} exceeds the tokenizer's model_max_length {longest}; raise "
            "tokenizer.model_max_length if the model takes longer sequences"
        )
    caps = [cap for cap in (dataset.max_samples, max_samples) if cap is not None]
    effective_seed = dataset.seed if dataset.seed is not None else seed
    samples = _samples(
        dataset,
        tokenizer,
        seq_len=seq_len,
        seed=effective_seed,
        ignore_index=ignore_index,
        max_samples=min(caps) if caps else None,
        group=process_group,
        vision=vision,
        image_token_id=image_token_id,
    )
    return ResumableLoader(
        samples,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        micro_batch_size=micro_batch_size,
        seed=effective_seed,
        shuffle=shuffle,
        drop_last=drop_last,
        infinite=infinite,
        ignore_index=ignore_index,
        num_workers=num_workers,
        pin_memory=pin_memory,
        prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers,
    )
