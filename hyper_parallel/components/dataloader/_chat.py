"""The ``chat`` source: chat records named in the config, encoded at launch as ``prepare`` would.

The files are planned and encoded by ``hyper_parallel.data.prepare``'s own functions (``plan`` and
``encode_pieces`` with ``--format chat`` options), held in memory as the shard arrays a prepare would
write: the same files give the same conversations, masks and record locations, so the same batches
prepared or not (``_samples.chat_samples`` cuts both). Every rank encodes every record: meant for small
sets (a first fine-tune); prepare larger ones once. Torch-free: ``--dry-run`` encodes with it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from hyper_parallel.data import shards
from hyper_parallel.data.prepare import (
    InputError,
    PrepareOptions,
    Unlabeled,
    chats_of,
    check_labels,
    encode_pieces,
    plan,
)
from hyper_parallel.errors import InputFileError

if TYPE_CHECKING:
    from hyper_parallel.components.dataloader.sources import ChatSource

__all__ = ["chat_shards", "check_chat_files"]

_log = logging.getLogger(__name__)


def _options(cfg: ChatSource) -> PrepareOptions:
    return PrepareOptions(format="chat", train_on=cfg.train_on, drop_unlabeled=cfg.drop_unlabeled)


def _input_error(exc: InputError) -> InputFileError:
    """prepare's ``WHERE: problem`` as the launch's input error (``FILE:LINE: problem``, exit 2)."""
    where, _, problem = str(exc).partition(": ")
    return InputFileError.at(where, problem)


def check_chat_files(cfg: ChatSource) -> None:
    """Every path exists and holds chat files, and the first record of each file is a conversation."""
    try:
        _, tasks = plan(cfg.paths, _options(cfg))
        seen: set[str] = set()
        for pieces in tasks:
            for piece in pieces:
                if piece.file not in seen:
                    seen.add(piece.file)
                    records = chats_of(piece)
                    next(records, None)
                    records.close()  # type: ignore[attr-defined]
    except InputError as exc:
        raise _input_error(exc) from None


def chat_shards(cfg: ChatSource, tokenizer: Any) -> tuple[list[shards.ShardArrays], tuple[str, ...]]:
    """The shard arrays ``prepare --format chat`` would write for ``cfg.paths`` with ``tokenizer`` (the
    tokenizer's own chat template, or the built-in one), and the input names their records index."""
    options = _options(cfg)
    try:
        records, tasks = plan(cfg.paths, options)
        names = {str(record["name"]): index for index, record in enumerate(records)}
        dtype = shards.token_dtype(int(tokenizer.vocab_size))
        unlabeled = Unlabeled()
        arrays = [encode_pieces(tokenizer, pieces, options, dtype, unlabeled, names) for pieces in tasks]
        labels = sum(int(a.mask.sum()) for a in arrays if a.mask is not None)
        check_labels(
            unlabeled, labels, options, ", ".join(cfg.paths), "dataloader.dataset.drop_unlabeled: true"
        )
        if unlabeled.count:
            _log.warning(
                "dataset: %d chat record(s) without a label left out (drop_unlabeled)", unlabeled.count
            )
    except InputError as exc:
        raise _input_error(exc) from None
    except ValueError as exc:  # the tokenizer's template cannot render chats (no generation marks)
        raise InputFileError.at(getattr(tokenizer, "source", None) or "tokenizer", str(exc)) from None
    return arrays, tuple(names)
