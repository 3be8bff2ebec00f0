"""The files a config names, checked at launch before anything is built.

A bad data file, tokenizer or weights folder used to surface minutes later as a traceback from deep inside
the build (exit status 1); here each is read just far enough to know it fits, and refused as an
``InputFileError`` (``FILE: problem``, exit status 2) while nothing is allocated yet:

- the datasets of the data loader and the validator: every path exists, the first record of each
  ``jsonl`` file is a JSON object with the text field, the data is not empty (``DatasetConfig.check_files``);
- ``model.weights_path``: ``config.json`` against the model's arguments, the safetensors headers, and the
  tensors' names, shapes and dtypes against the model (``models.check_weights``), on rank 0 only (the
  only rank that reads weights), its verdict shared with the others;
- the tokenizer, built here (before the model): its files, its size against the model's embedding table
  (``rules.vocabulary_issues``, the resolver's rule with the loaded size), its ``model_max_length`` against
  ``training.seq_len`` (``rules.sequence_length_issues``) and its EOS when packing.

Every rank runs the data and tokenizer checks on the same files, so every rank raises the same error, and
the launch command line prints it once (rank 0).

``--dry-run`` runs the same checks, none of which needs torch (:func:`check_without_torch`): the data
files, the weights folder (``models.check_weights`` reads headers and maps shapes, never tensors), the
prepared folders' manifests, shards and tokenizer fingerprints, and the tokenizer against the model. This
module imports torch only where a process group may exist.
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any

from hyper_parallel.errors import InputFileError, Issue
from hyper_parallel.trainer import rules

if TYPE_CHECKING:
    from hyper_parallel.trainer.config import TrainerConfig

__all__ = ["build_tokenizer", "check_files", "check_without_torch"]


def check_files(config: TrainerConfig) -> None:
    """Refuse the data and weights files ``config`` names when they cannot feed its run."""
    for dataset in _datasets(config):
        dataset.check_files()
    spec = config.model
    if spec.awaits_weights:  # (the launch resolves again once its file checks fetched a Hub id)
        message = (
            f"{spec.weights_path} was not on this machine when the config was resolved (flavor auto "
            "has not read its config.json, a Hub id is not in the cache): fetch it, then resolve the "
            "config again (train_lm does both)"
        )
        raise InputFileError([Issue("model.weights_path", message, "")])
    if spec.weights_path is not None:
        from hyper_parallel.models import check_weights

        fetch = _weights_fetch(spec)  # a Hub id's weights, into the cache first

        def fetch_and_check() -> None:
            if fetch is not None:
                fetch()
            check_weights(spec)

        _on_rank0(fetch_and_check)


def check_without_torch(config: TrainerConfig) -> None:
    """The launch's checks of the files ``config`` names that need no torch, raising as the launch does
    (``InputFileError`` / ``PreparedDataError``: ``FILE: problem``, exit status 2): the datasets' files,
    the weights folder (the launch's ``check_weights``, in the launch's order), the tokenizer (built: its
    files, its size against the model, its EOS), then each prepared folder's manifest, shards and
    tokenizer fingerprint. What a Hub id would download is said (``note:``), not downloaded: weights the
    cache lacks are not checked, a tokenizer it lacks is not built (nor the data encoded with it)."""
    sections = _datasets(config)
    for dataset in sections:
        dataset.check_files()
    if config.model.weights_path is not None:
        from hyper_parallel.models import check_weights

        fetch = _weights_fetch(config.model)
        pending = fetch(dry_run=True) if fetch is not None else None
        if pending is None:
            check_weights(config.model)
        else:  # the launch downloads them first, then checks them
            print(f"note: {pending}", file=sys.stderr)
    pending = _tokenizer_download(config)
    if pending is not None:  # the launch downloads its files first, then builds and checks it
        print(f"note: {pending}", file=sys.stderr)
        return
    tokenizer = build_tokenizer(config)
    for dataset in sections:
        dataset.check_encoded(tokenizer, config.model.args, config.training.seq_len)


def _tokenizer_download(config: TrainerConfig) -> str | None:
    """What the launch would download of a Hub tokenizer the cache lacks (one line), or None: a
    ``--dry-run`` asks the Hub, never downloads, so such a tokenizer is built by the launch alone."""
    source = getattr(config.tokenizer, "path", None) or config.model.weights_path
    if not config.tokenizer.needs_files() or source is None:
        return None
    from hyper_parallel._hub import TOKENIZER_FILES, pending_download
    from hyper_parallel.components.tokenizer._runtime import tokenizer_hub_id

    hub_id = tokenizer_hub_id(source)
    return None if hub_id is None else pending_download(hub_id, TOKENIZER_FILES)


def _weights_fetch(spec: Any) -> Any:
    """What brings a Hub id's weights into the cache (called with ``dry_run=True``: what it would download,
    as one line or None): the transformers target's own ``fetch_weights``, else, for a native model whose
    ``weights_path`` is a Hub id (the cache lacked it at resolve) or a Hub cache snapshot, a fetch of that
    snapshot; None for a local folder."""
    fetch = getattr(spec.args, "fetch_weights", None)
    if callable(fetch):
        return fetch
    from hyper_parallel._hub import fetch_weights, hub_id_of, is_hub_id

    hub_id = spec.weights_path if is_hub_id(spec.weights_path) else hub_id_of(spec.weights_path)
    if hub_id is None:
        return None
    return functools.partial(fetch_weights, hub_id, "model.weights_path")


def _datasets(config: TrainerConfig) -> list[Any]:
    """The dataset sections the run reads: the data loader's, and the validator's when it is on."""
    sections = [config.dataloader, config.validator if config.validator.enable else None]
    found = [getattr(section, "dataset", None) for section in sections]
    return [dataset for dataset in found if callable(getattr(dataset, "check_files", None))]


def _on_rank0(check: Any) -> None:
    """Run ``check()`` on rank 0 (every rank when there is no process group); every rank raises its error."""
    dist: Any = sys.modules.get("torch.distributed")  # a process group exists only once torch is imported
    distributed = (
        dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    )
    if not distributed:
        check()
        return
    found: list[object] = [None]
    if dist.get_rank() == 0:
        try:
            check()
        except InputFileError as exc:
            found[0] = exc
        except Exception as exc:  # the others would wait for a verdict that never comes
            found[0] = f"{type(exc).__name__}: {exc}"
    dist.broadcast_object_list(found, src=0)
    if isinstance(found[0], InputFileError):
        raise found[0]
    if found[0] is not None:
        raise RuntimeError(f"rank 0 could not check model.weights_path: {found[0]}")


def build_tokenizer(config: TrainerConfig) -> Any:
    """The run's tokenizer, refused when the model cannot embed its ids, its files' ``model_max_length``
    is below ``training.seq_len`` or packing lacks its EOS."""
    tokenizer = config.tokenizer.build(config.model.weights_path)
    where = getattr(tokenizer, "source", None) or "tokenizer"
    vocab = getattr(tokenizer, "vocab_size", None)
    issues = []
    if isinstance(vocab, int):
        issues += [Issue("", message, where) for _path, message in rules.vocabulary_issues(config, vocab)]
    if getattr(config.tokenizer, "model_max_length", None) is None:  # else the resolve checked it
        longest = getattr(tokenizer, "model_max_length", None)
        if isinstance(longest, int):
            found = rules.sequence_length_issues(config, longest, from_files=True)
            issues += [Issue("", f"{path} {message}", where) for path, message in found]
    dataset = getattr(config.dataloader, "dataset", None)
    if dataset is not None:
        issues += [Issue("", message, where) for message in dataset.tokenizer_issues(tokenizer)]
    if issues:
        raise InputFileError(issues)
    return tokenizer
