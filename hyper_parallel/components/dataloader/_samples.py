"""Samples from token streams: packed or padded documents, synthetic windows, captioned images.

Part of ``DataLoader``. With ``pack_sequences`` every document ends with EOS and the documents are
concatenated and cut into windows of ``seq_len`` tokens (the incomplete tail is dropped); a packed sample
also carries ``document_ids`` when ``document_masking`` is on. Otherwise each document is one sample, cut
or padded with the pad id on the tokenizer's ``padding_side`` (padded labels are ``ignore_index``). Chat
data (``chat_samples``: a prepared chat folder, or the ``chat`` source) is never cut that way: each row
holds whole conversations, bin-packed and padded, and a conversation longer than ``seq_len`` follows the
dataset's ``overlong`` policy (``_overlong``).
``labels`` is aligned with ``input_ids`` (the loss shifts). ``max_samples`` keeps the first samples.

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
- ``image_chat``: one conversation with images per sample (``_image_chat``): the built-in chat format with
  each image as its placeholder ids, right-padded to ``seq_len`` (never cut), labels on the assistant
  tokens only; ``pixel_values`` are read with Pillow when the sample is loaded (the model's ``images``) and
  ``grid_thw`` has one row per image. A batch concatenates its samples' patch rows and image rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.utils.data

from hyper_parallel.components.dataloader._corpus import (
    ChatRows,
    Corpus,
    PackedSamples,
    PaddedSamples,
    Samples,
    corpus_in_memory,
)
from hyper_parallel.components.dataloader._overlong import refuse_or_say
from hyper_parallel.components.dataloader._tokenizing import encode, tokenize
from hyper_parallel.data.packing import Rows, fitted, pack_rows

if TYPE_CHECKING:
    from hyper_parallel.components.dataloader import LoaderRequest
    from hyper_parallel.components.dataloader._images import ShapeImages
    from hyper_parallel.components.dataloader.sources import ChatSource, ImageChatSource, TokenizedSource

__all__ = [
    "Samples",
    "WithFiller",
    "chat_samples",
    "collate_fn",
    "document_samples",
    "image_chat_samples",
    "shapes_samples",
    "synthetic_samples",
]


class _SyntheticSamples(Samples):
    def __init__(self, count: int, seq_len: int, vocab_size: int, seed: int) -> None:
        self.count, self.seq_len, self.vocab_size, self.seed = count, seq_len, vocab_size, seed

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        ids = torch.randint(0, self.vocab_size, (self.seq_len,), generator=gen)
        return {"input_ids": ids, "labels": ids.clone()}


class _ShapesSamples(Samples):
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


class _ImageChatSamples(Samples):
    """Conversations with images (``_image_chat``): ids and labels held, pixels read when loaded."""

    def __init__(
        self,
        rows: list[tuple[torch.Tensor, torch.Tensor, tuple[Path, ...], list[tuple[int, int]]]],
        *,
        vision: Any,
    ) -> None:
        self.rows = rows
        self.patch, self.merge = int(vision.patch_size), int(vision.spatial_merge_size)
        self.temporal = int(vision.temporal_patch_size)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        from hyper_parallel.models.qwen3_5.images import image_pixels, patchify

        input_ids, labels, images, sizes = self.rows[index]
        patches = [
            patchify(image_pixels(image, size), self.patch, self.temporal, self.merge)
            for image, size in zip(images, sizes, strict=True)
        ]
        grid = [[1, height // self.patch, width // self.patch] for width, height in sizes]
        return {
            "input_ids": input_ids,
            "labels": labels,
            "pixel_values": torch.cat(patches),
            "grid_thw": torch.tensor(grid, dtype=torch.int64),
        }


def _collate_images(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack the samples' tensors, except the images': each sample's patch rows (``pixel_values``) and
    image grids (``grid_thw``, one row per image) concatenated in sample order."""
    batch = {key: torch.stack([sample[key] for sample in samples]) for key in ("input_ids", "labels")}
    batch["pixel_values"] = torch.cat([sample["pixel_values"] for sample in samples])
    batch["grid_thw"] = torch.cat([sample["grid_thw"].view(-1, 3) for sample in samples])
    return batch


def image_chat_samples(
    cfg: ImageChatSource, request: LoaderRequest, max_samples: int | None
) -> _ImageChatSamples:
    """Every conversation of an ``image_chat`` dataset, encoded (``_image_chat.encode_record``) and padded
    on the right to ``seq_len`` with labels on the assistant tokens only."""
    from hyper_parallel.components.dataloader._image_chat import encode_record, read_records
    from hyper_parallel.components.dataloader._sources import image_chat_files
    from hyper_parallel.models.qwen3_5.images import Geometry

    vision, image_token_id = request.vision, request.image_token_id
    if vision is None or image_token_id is None:
        raise ValueError(
            "the image_chat source needs a vision-language model: build the data loader with the model's "
            "vision arguments (vision=) and image placeholder id (image_token_id=)"
        )
    tokenizer, seq_len, ignore = request.tokenizer, request.seq_len, request.ignore_index
    pad = getattr(tokenizer, "pad_id", None)
    pad = getattr(tokenizer, "eos_id", None) if pad is None else pad
    geometry = Geometry.of(vision, cfg.pixel_bounds())
    rows: list[tuple[torch.Tensor, torch.Tensor, tuple[Path, ...], list[tuple[int, int]]]] = []
    for file in image_chat_files(cfg.paths):
        for record in read_records(file):
            if max_samples is not None and len(rows) >= max_samples:
                break
            ids, mask, sizes = encode_record(record, tokenizer, image_token_id, geometry, seq_len)
            fill = seq_len - len(ids)
            input_ids = torch.tensor(ids + [0 if pad is None else pad] * fill, dtype=torch.int64)
            labels = torch.tensor(
                [i if m else ignore for i, m in zip(ids, mask, strict=True)] + [ignore] * fill,
                dtype=torch.int64,
            )
            rows.append((input_ids, labels, record.images, sizes))
    return _ImageChatSamples(rows, vision=vision)


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
    for name, ids in zip(names, encode(tokenizer, names), strict=True):
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


class WithFiller(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """``samples``, plus index ``FILLER``: sample 0 with every label ``ignore_index`` (counts no token)."""

    FILLER = -1

    def __init__(self, samples: Samples, ignore_index: int) -> None:
        self.samples, self.ignore_index = samples, ignore_index

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index != self.FILLER:
            return self.samples[index]
        sample = self.samples[0]
        return {**sample, "labels": torch.full_like(sample["labels"], self.ignore_index)}


def _packed(
    docs: Iterator[list[int]],
    eos: int,
    seq_len: int,
    max_samples: int | None,
    document_masking: bool,
    ignore: int,
) -> Samples:
    limit = None if max_samples is None else max_samples * seq_len
    corpus = corpus_in_memory(docs, eos, stop_after_tokens=limit)
    return packed_samples(corpus, seq_len, max_samples, document_masking, ignore)


def packed_samples(
    corpus: Corpus, seq_len: int, max_samples: int | None, masking: bool, ignore_index: int
) -> Samples:
    """Windows of a corpus (``masking``: with document ids), the first ``max_samples`` (None: all)."""
    count = corpus.tokens // seq_len
    if max_samples is not None:
        count = min(count, max_samples)
    return PackedSamples(corpus, seq_len, count, masking, ignore_index)


def chat_samples(
    corpus: Corpus, cfg: TokenizedSource | ChatSource, request: LoaderRequest, max_samples: int | None
) -> Samples:
    """Samples of whole conversations (a corpus with an assistant mask): rows bin-packed
    (``ChatRows``), or one conversation per sample padded per the tokenizer (``cfg.pack_sequences``); a
    conversation longer than ``seq_len`` is refused (``overlong: error``, at its record's ``FILE:LINE``),
    dropped or cut, and a drop or cut is logged with its count. ``max_samples`` keeps the first rows."""
    tokenizer, seq_len, ignore_index = request.tokenizer, request.seq_len, request.ignore_index
    overlong, masking = cfg.overlong, cfg.document_masking
    lengths = corpus.lengths()
    sizes, kept = fitted(lengths, seq_len, overlong)
    refuse_or_say(lengths, seq_len, overlong, corpus.location, corpus.label)
    if not cfg.pack_sequences:
        pad = getattr(tokenizer, "pad_id", None)
        if pad is None:
            raise ValueError("padding documents (pack_sequences: false) needs a tokenizer with a pad token")
        left = getattr(tokenizer, "padding_side", "right") == "left"
        count = kept.size if max_samples is None else min(kept.size, max_samples)
        return PaddedSamples(
            corpus, seq_len, count, pad=pad, left=left, ignore_index=ignore_index, documents=kept
        )
    rows = pack_rows(sizes, seq_len, kept)
    if max_samples is not None and max_samples < len(rows):
        rows = Rows(rows.starts[: max_samples + 1], rows.documents[: int(rows.starts[max_samples])])
    pad = getattr(tokenizer, "pad_id", None)
    pad = getattr(tokenizer, "eos_id", None) if pad is None else pad
    return ChatRows(
        corpus, rows, seq_len, pad=0 if pad is None else pad, masking=masking, ignore_index=ignore_index
    )


def padded_samples(
    corpus: Corpus, tokenizer: Any, seq_len: int, max_samples: int | None, ignore_index: int
) -> Samples:
    """One document of a corpus per sample, the first ``max_samples``, padded per the tokenizer."""
    pad = getattr(tokenizer, "pad_id", None)
    if pad is None:
        raise ValueError("padding documents (pack_sequences: false) needs a tokenizer with a pad token")
    left = getattr(tokenizer, "padding_side", "right") == "left"
    count = corpus.documents if max_samples is None else min(corpus.documents, max_samples)
    return PaddedSamples(corpus, seq_len, count, pad=pad, left=left, ignore_index=ignore_index)


def collate_fn(samples: Samples) -> Callable[[list[dict[str, torch.Tensor]]], dict[str, torch.Tensor]] | None:
    """How a batch of ``samples`` is assembled: image patches are concatenated; None stacks every tensor."""
    return _collate_images if isinstance(samples, (_ShapesSamples, _ImageChatSamples)) else None


def shapes_samples(request: LoaderRequest, seed: int, count: int) -> Samples:
    """``count`` captioned images of shapes drawn from ``seed``, for the request's model layout."""
    return _shapes(
        request.tokenizer,
        vision=request.vision,
        image_token_id=request.image_token_id,
        seq_len=request.seq_len,
        seed=seed,
        count=count,
        ignore_index=request.ignore_index,
    )


def synthetic_samples(request: LoaderRequest, seed: int, count: int) -> Samples:
    """``count`` windows of random token ids drawn from ``seed`` below the tokenizer's vocabulary size."""
    vocab = getattr(request.tokenizer, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1:
        raise ValueError("the synthetic source needs a tokenizer with a positive vocab_size")
    return _SyntheticSamples(count, request.seq_len, vocab, seed)


def document_samples(
    documents: Iterator[str],
    request: LoaderRequest,
    *,
    pack: bool,
    document_masking: bool,
    max_samples: int | None,
) -> Samples:
    """Text ``documents`` tokenized (shared over the request's ``process_group``) and packed, or padded
    one per sample; ``max_samples`` (None: all) keeps the first samples."""
    tokenizer, seq_len, ignore_index = request.tokenizer, request.seq_len, request.ignore_index
    docs = tokenize(tokenizer, documents, request.process_group)
    try:
        if pack:
            eos = getattr(tokenizer, "eos_id", None)
            if eos is None:
                raise ValueError("packing documents needs a tokenizer with an eos token")
            return _packed(docs, eos, seq_len, max_samples, document_masking, ignore_index)
        corpus = corpus_in_memory(iter(itertools.islice(docs, max_samples)), None)
        return padded_samples(corpus, tokenizer, seq_len, max_samples, ignore_index)
    finally:
        docs.close()  # type: ignore[attr-defined]
