"""The ``tokenized`` source: prepared folders memory-mapped, one source of samples each (``DataLoader``).

Each path of ``dataset.paths`` is a folder written by ``python -m hyper_parallel.data prepare``; it is opened
with ``hyper_parallel.data.shards`` (manifest, sizes and quick digests checked; nothing of the text read),
refused when its tokenizer fingerprint is not the training tokenizer's, and cut into samples exactly as an
in-memory source of the same documents would be (``_corpus``). With several paths, each is its own source
of the blended order (``_order``), weighted by ``dataset.weights`` (default: by its size).

``holdout_fraction`` sets apart the last documents of each folder (that fraction of them, rounded down):
``split: train`` reads the documents before them, ``split: holdout`` those documents only, so validation
samples never share a token with the training samples.

A folder of chat data (its shards carry an assistant mask) gives rows of whole conversations
(``_samples.chat_samples``), its conversations longer than ``seq_len`` refused, dropped or cut by
``overlong``, named by their record (``FILE:LINE``) where the folder records it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hyper_parallel.components.dataloader._corpus import ConcatSamples, Corpus, Samples
from hyper_parallel.components.dataloader._prepared_check import (
    PreparedDataError,
    input_names,
    open_for_training,
)
from hyper_parallel.components.dataloader._samples import chat_samples, packed_samples, padded_samples
from hyper_parallel.data.shards import tokenizer_fingerprint
from hyper_parallel.errors import Issue

if TYPE_CHECKING:
    from hyper_parallel.components.dataloader import LoaderRequest
    from hyper_parallel.components.dataloader.sources import TokenizedSource

__all__ = ["PreparedDataError", "prepared_samples"]


def _corpus(
    path: str,
    cfg: TokenizedSource,
    fingerprint: tuple[str, dict[str, object]],
    vocab_size: int,
    template: str | None,
) -> Corpus:
    prepared = open_for_training(path, fingerprint, template)
    first, count = cfg.selected(prepared.documents)
    return Corpus(
        prepared.shards,
        first=first,
        documents=count,
        vocab_size=vocab_size,
        names=input_names(prepared.manifest),
        label=path,
    )


def prepared_samples(cfg: TokenizedSource, request: LoaderRequest, *, max_samples: int | None) -> Samples:
    """Samples of every prepared folder of ``cfg.paths`` (one source each), cut as ``cfg`` says."""
    tokenizer = request.tokenizer
    fingerprint = tokenizer_fingerprint(tokenizer)
    eos = getattr(tokenizer, "eos_id", None)
    sources: list[Samples] = []
    for path in cfg.paths:
        corpus = _corpus(path, cfg, fingerprint, tokenizer.vocab_size, tokenizer.chat_template)
        if corpus.chat:
            samples = chat_samples(corpus, cfg, request, max_samples)
        elif cfg.pack_sequences:
            if eos is None:
                raise ValueError("packing documents needs a tokenizer with an eos token")
            samples = packed_samples(
                corpus,
                request.seq_len,
                max_samples,
                cfg.document_masking,
                request.ignore_index,
            )
        else:
            samples = padded_samples(corpus, tokenizer, request.seq_len, max_samples, request.ignore_index)
        if len(samples) == 0:
            where = f"{path} ({cfg.split} split)" if cfg.holdout_fraction else path
            raise PreparedDataError(
                [Issue("dataset.paths", f"holds no sample of {request.seq_len} tokens", where)]
            )
        sources.append(samples)
    return sources[0] if len(sources) == 1 else ConcatSamples(sources)
