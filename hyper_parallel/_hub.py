"""Hugging Face Hub ids as folders: ``org/name[@revision]`` found in (or fetched into) the Hub cache.

Every path that names a model or tokenizer folder accepts one: the transformers target's ``path``, the
native models' ``weights_path`` and ``tokenizer.path``. It sits at the package root (stdlib only at import)
so that the components and the models both read it without one importing the other's private modules.

Resolved through ``huggingface_hub`` as its own clients do: its cache (``HF_HUB_CACHE``, else
``HF_HOME/hub``, else its default), ``HF_HUB_OFFLINE``. Found in the cache, used as it is; not found while
offline, refused in one line naming the id and the cache searched; online, downloaded with
``huggingface_hub``'s progress bars. Resolving a config fetches ``config.json`` alone (what the model's
arguments are read from); the weights are fetched by the launch (rank 0, which reads them), and
``--dry-run`` only says what the launch would download. huggingface_hub is imported inside the functions.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = [
    "CONFIG_FILES",
    "TOKENIZER_FILES",
    "WEIGHT_FILES",
    "hub_id_of",
    "is_hub_id",
    "pending_download",
    "snapshot",
]

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9._/-]+)?$")
#: What resolving a config needs of a model repository.
CONFIG_FILES = ["config.json"]
#: What training needs of it: the config, the safetensors weights and their index, the tokenizer's files.
WEIGHT_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja"]
#: What building a tokenizer reads of it.
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json"]
#: Patterns a cached snapshot must match for each of the two (else it is incomplete: fetched again).
_REQUIRED = {
    "config.json": ["config.json"],
    "*.safetensors": ["config.json", "*.safetensors"],
    "tokenizer.json": ["tokenizer.json"],
}


def is_hub_id(path: str) -> bool:
    """Whether ``path`` names a Hub repository (``org/name`` or ``org/name@revision``), not a local path."""
    return not Path(path).exists() and _HUB_ID.match(path) is not None


def hub_id_of(folder: str) -> str | None:
    """``org/name@commit`` when ``folder`` is a snapshot in the Hub cache's layout
    (``.../models--org--name/snapshots/COMMIT``), else None: a resolved folder still names what the launch
    fetches into it."""
    where = Path(folder)
    entry = where.parent.parent.name
    if where.parent.name != "snapshots" or not entry.startswith("models--"):
        return None
    org, sep, name = entry[len("models--") :].partition("--")
    hub_id = f"{org}/{name}@{where.name}"
    return hub_id if sep and _HUB_ID.match(hub_id) else None


def _settings(hub_id: str) -> tuple[str, bool]:
    """The cache folder and whether ``HF_HUB_OFFLINE`` is set, read now (not at huggingface_hub's import)."""
    try:
        from huggingface_hub import constants
    except ImportError:
        raise ValueError(
            f"{hub_id}: huggingface_hub is not installed, and a Hub id needs it "
            "(python -m pip install -e '.[hf]')"
        ) from None

    cache = os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else constants.HF_HUB_CACHE
    )
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
    return cache, offline


def _split(hub_id: str) -> tuple[str, str | None]:
    repo, _, revision = hub_id.partition("@")
    return repo, revision or None


def snapshot(hub_id: str, patterns: list[str]) -> str:
    """The local snapshot folder of ``hub_id`` holding the files ``patterns`` match (downloaded when online
    and not cached). ``ValueError`` (one line) when it cannot be had."""
    cache, offline = _settings(hub_id)  # first: refuses in one line without huggingface_hub
    from huggingface_hub import snapshot_download

    repo, revision = _split(hub_id)
    try:
        folder: str = snapshot_download(
            repo, revision=revision, cache_dir=cache, local_files_only=True, allow_patterns=patterns
        )
        required = _REQUIRED[
            next((p for p in ("*.safetensors", "tokenizer.json") if p in patterns), "config.json")
        ]
        if all(any(Path(folder).glob(p)) for p in required):
            return folder
    except (OSError, ValueError):
        pass
    if offline:
        raise ValueError(
            f"{hub_id}: not in the Hugging Face cache {cache} (HF_HUB_OFFLINE is set: nothing is downloaded)"
        )
    try:
        fetched: str = snapshot_download(repo, revision=revision, cache_dir=cache, allow_patterns=patterns)
    except Exception as exc:  # huggingface_hub's HTTP, repository and revision errors
        detail = " ".join(str(exc).split())
        raise ValueError(f"{hub_id}: cannot be fetched from the Hugging Face Hub: {detail}") from None
    return fetched


def pending_download(hub_id: str, patterns: list[str]) -> str | None:
    """What fetching ``patterns`` of ``hub_id`` would download (``huggingface_hub``'s dry run), as one line;
    None when the cache holds it all."""
    cache, offline = _settings(hub_id)  # first: refuses in one line without huggingface_hub
    from huggingface_hub import snapshot_download

    repo, revision = _split(hub_id)
    if offline:
        return None  # what the cache lacks is refused where it is read
    try:
        planned = snapshot_download(
            repo, revision=revision, cache_dir=cache, allow_patterns=patterns, dry_run=True
        )
    except Exception as exc:
        detail = " ".join(str(exc).split())
        return f"{hub_id}: the Hugging Face Hub cannot be asked what to download: {detail}"
    missing = [f for f in planned if getattr(f, "will_download", True)]
    if not missing:
        return None
    size = sum(int(getattr(f, "file_size", 0) or 0) for f in missing)
    return f"{hub_id}: the launch downloads {len(missing)} file(s), {size / 1e6:.1f} MB, into {cache}"
