"""Opening a prepared folder for training: its manifest, shards and tokenizer fingerprint checked.

One function for the two places that ask: the loader (``_prepared``, at launch) and ``--dry-run``, which
imports no torch (this module imports numpy, through ``hyper_parallel.data.shards``, and nothing of torch).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from hyper_parallel.data.shards import MANIFEST, PreparedCorpus, PreparedError, open_prepared
from hyper_parallel.errors import ConfigError, Issue

__all__ = ["PreparedDataError", "input_names", "open_for_training"]


class PreparedDataError(ConfigError):
    """A prepared folder the config names cannot be trained on: ``FILE: dataset.paths: PROBLEM``, exit 2."""


def open_for_training(
    path: str, fingerprint: tuple[str, dict[str, object]], chat_template: str | None
) -> PreparedCorpus:
    """The prepared folder at ``path``, refused (``PreparedDataError``) when its manifest or shards are
    damaged, it was prepared with a tokenizer other than the one of ``fingerprint``, its chats were rendered
    with another template than ``chat_template`` (the training tokenizer's; None: the built-in format), so
    that ``prepare`` and training cannot disagree on it, or it is chat data in which no token carries a
    label (a run would log a loss of 0 and train on nothing)."""
    try:
        prepared = open_prepared(path, tokenizer=fingerprint)
    except PreparedError as exc:
        raise PreparedDataError([Issue("dataset.paths", exc.problem, exc.where)]) from None
    recorded = prepared.manifest.get("chat_template_sha256")
    wanted = None if chat_template is None else hashlib.sha256(chat_template.encode("utf-8")).hexdigest()
    if prepared.chat and recorded != wanted:
        used = "the built-in format" if recorded is None else f"the chat template of SHA-256 {recorded[:16]}"
        ours = "the built-in format" if wanted is None else f"the template of SHA-256 {wanted[:16]}"
        problem = (
            f"its conversations were rendered with {used}, but the config's tokenizer renders them with "
            f"{ours}: set tokenizer.chat_template to the template given to prepare --chat-template (or "
            "prepare the data again with this config)"
        )
        raise PreparedDataError([Issue("dataset.paths", problem, str(Path(path) / MANIFEST))])
    if prepared.label_tokens == 0:
        problem = (
            f"chat data in which no token carries a label (0 of {prepared.tokens:,}): a run would train on "
            "nothing; prepare it again (prepare names the records without a trained turn)"
        )
        raise PreparedDataError([Issue("dataset.paths", problem, path)])
    return prepared


def input_names(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The names of the inputs a prepared folder was made from, in the manifest's order (what its chat
    shards' ``records`` index)."""
    inputs = manifest.get("inputs")
    if not isinstance(inputs, list):
        return ()
    return tuple(str(entry.get("name", "")) if isinstance(entry, dict) else "" for entry in inputs)
