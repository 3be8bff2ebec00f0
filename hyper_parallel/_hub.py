"""Hugging Face Hub ids as folders: ``org/name[@revision]`` found in (or fetched into) the Hub cache.

Every path that names a model or tokenizer folder accepts one: the transformers target's ``path``, the
native models' ``weights_path`` and ``tokenizer.path``. It sits at the package root (stdlib only at import)
so that the components and the models both read it without one importing the other's private modules.

A path is read as transformers reads ``from_pretrained``'s argument: one that exists on this machine is a
local path; so is one that is absolute, starts with ``.`` or ``~``, has more than one ``/`` before its
``@``, or is no valid Hub repository id. Only a missing ``org/name[@revision]`` is a Hub id, and since it
may still be a folder the user forgot to make (``runs/qwen3_5_debug_hf``), a refusal names both readings.

Resolved through ``huggingface_hub`` as its own clients do: its cache (``HF_HUB_CACHE``, else
``HF_HOME/hub``, else its default), ``HF_HUB_OFFLINE``. Resolving a config looks only into the cache for
the native ``weights_path`` and ``tokenizer.path`` (``cached``: never the network); the transformers
target's ``path`` is the exception, as its arguments come from ``config.json``: resolving it fetches that one
file (``CONFIG_FILES``) when the cache lacks it and the Hub is reachable. The launch's file checks
fetch what the cache lacks (``snapshot``: online,
with ``huggingface_hub``'s progress bars), and ``--dry-run``'s only ask the Hub whether the id is there
(``lookup_problem``) and what the launch would download (``pending_download``). huggingface_hub is
imported inside the functions.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = [
    "CONFIG_FILES",
    "TOKENIZER_FILES",
    "WEIGHT_FILES",
    "cached",
    "fetch_weights",
    "hub_id_of",
    "is_hub_id",
    "lookup_problem",
    "pending_download",
    "snapshot",
]

#: ``org/name`` (huggingface_hub's repository id rules: letters, digits, ``_.-``, at most 96 each, no
#: ``--`` or ``..``, no ``.``/``-`` last), then an optional ``@revision`` (a branch, tag or commit).
_HUB_ID = re.compile(r"^(?P<org>\w[\w.-]{0,95})/(?P<name>\w[\w.-]{0,95})(@[\w./-]+)?$", re.ASCII)
#: What resolving a config needs of a model repository.
CONFIG_FILES = ["config.json"]
#: What training needs of it: the config, the safetensors weights and their index, the tokenizer's files.
WEIGHT_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja"]
#: What building a tokenizer reads of it.
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json"]
#: Patterns a cached snapshot must match for each of the three (else it is incomplete: fetched again).
_REQUIRED = {
    "config.json": ["config.json"],
    "*.safetensors": ["config.json", "*.safetensors"],
    "tokenizer.json": ["tokenizer.json"],
}


def is_hub_id(path: str) -> bool:
    """Whether ``path`` is read as a Hub id (``org/name[@revision]`` not on this machine) rather than a
    local path (the module docstring's rules)."""
    found = _HUB_ID.match(path)
    if found is None or Path(path).exists():
        return False
    parts = (found["org"], found["name"])
    return not any("--" in p or ".." in p or p[-1] in ".-" or p.endswith(".git") for p in parts)


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
            f"{hub_id} is not on this machine, and huggingface_hub, which would look it up as a Hub id, is "
            "not installed (python -m pip install -e '.[hf]')"
        ) from None

    cache = os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else constants.HF_HUB_CACHE
    )
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
    return cache, offline


def _split(hub_id: str) -> tuple[str, str | None]:
    repo, _, revision = hub_id.partition("@")
    return repo, revision or None


def _not_here(hub_id: str, patterns: list[str]) -> str:
    """The local reading of ``hub_id``, which every refusal names first."""
    return (
        f"{hub_id} is not a {'file or folder' if patterns == TOKENIZER_FILES else 'folder'} on this machine"
    )


def _required(patterns: list[str]) -> list[str]:
    return _REQUIRED[next((p for p in ("*.safetensors", "tokenizer.json") if p in patterns), "config.json")]


def cached(hub_id: str, patterns: list[str]) -> str | None:
    """The snapshot folder of ``hub_id`` in the cache when it holds what ``patterns`` needs, else None.
    Never the network (what resolving a config may do)."""
    try:
        cache, _ = _settings(hub_id)
    except ValueError:
        return None
    from huggingface_hub import snapshot_download

    repo, revision = _split(hub_id)
    try:
        folder: str = snapshot_download(
            repo, revision=revision, cache_dir=cache, local_files_only=True, allow_patterns=patterns
        )
    except (OSError, ValueError):
        return None
    return folder if all(any(Path(folder).glob(p)) for p in _required(patterns)) else None


def _offline_problem(hub_id: str, patterns: list[str], cache: str) -> str:
    partial = cached(hub_id, CONFIG_FILES) if patterns != CONFIG_FILES else None
    if partial is not None:  # its config.json only (what the resolve needed): the weights are not there
        missing = [p for p in _required(patterns) if not any(Path(partial).glob(p))]
        return (
            f"{hub_id}: the Hugging Face cache (HF_HUB_CACHE={cache}) holds it without "
            f"{', '.join(missing)} (offline: nothing is downloaded)"
        )
    return (
        f"{_not_here(hub_id, patterns)}, and no Hub model of that id is in the cache "
        f"(HF_HUB_CACHE={cache}; offline)"
    )


def _hub_answer(hub_id: str, patterns: list[str], exc: Exception) -> str:
    """The Hub's refusal of ``hub_id`` as one line after the local reading (never a traceback)."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    repo, revision = _split(hub_id)
    if isinstance(exc, GatedRepoError):
        answer = f"answers: gated (accept its terms at https://huggingface.co/{repo}, then hf auth login)"
    elif isinstance(exc, RepositoryNotFoundError):
        answer = "answers: not found (no model of that id, or a private one: hf auth login)"
    elif isinstance(exc, RevisionNotFoundError):
        answer = f"answers: {repo} has no revision {revision!r}"
    else:
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        answer = f"cannot be asked ({detail})"
    return f"{_not_here(hub_id, patterns)}, and the Hugging Face Hub {answer}"


def snapshot(hub_id: str, patterns: list[str]) -> str:
    """The local snapshot folder of ``hub_id`` holding the files ``patterns`` match (downloaded with
    progress bars when online and not cached). ``ValueError`` (one line) when it cannot be had."""
    cache, offline = _settings(hub_id)  # first: refuses in one line without huggingface_hub
    found = cached(hub_id, patterns)
    if found is not None:
        return found
    if offline:
        raise ValueError(_offline_problem(hub_id, patterns, cache))
    from huggingface_hub import snapshot_download

    repo, revision = _split(hub_id)
    try:
        fetched: str = snapshot_download(repo, revision=revision, cache_dir=cache, allow_patterns=patterns)
    except Exception as exc:  # huggingface_hub's HTTP, repository and revision errors
        raise ValueError(_hub_answer(hub_id, patterns, exc)) from None
    return fetched


def lookup_problem(hub_id: str, patterns: list[str]) -> str | None:
    """Why ``hub_id``'s files cannot be had (one line naming both readings), or None: in the cache, or
    (online) on the Hub, asked without downloading (``--dry-run``)."""
    try:
        cache, offline = _settings(hub_id)
    except ValueError as exc:
        return str(exc)
    if cached(hub_id, patterns) is not None:
        return None
    if offline:
        return _offline_problem(hub_id, patterns, cache)
    from huggingface_hub import snapshot_download

    repo, revision = _split(hub_id)
    try:
        snapshot_download(repo, revision=revision, cache_dir=cache, allow_patterns=patterns, dry_run=True)
    except Exception as exc:
        return _hub_answer(hub_id, patterns, exc)
    return None


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
        return _hub_answer(hub_id, patterns, exc)
    missing = [f for f in planned if getattr(f, "will_download", True)]
    if not missing:
        return None
    size = sum(int(getattr(f, "file_size", 0) or 0) for f in missing)
    return f"{hub_id}: the launch downloads {len(missing)} file(s), {size / 1e6:.1f} MB, into {cache}"


def fetch_weights(hub_id: str, field: str, *, dry_run: bool = False) -> str | None:
    """Bring ``hub_id``'s weights (``WEIGHT_FILES``) into the cache, or with ``dry_run`` say in one line
    what that would download (None: nothing): what the launch does for the config field ``field`` that
    names it (the transformers target's ``model.path``, a native model's ``model.weights_path``). A
    refusal is the config layer's ``InputFileError`` at ``field``: an input the user can fix, exit 2."""
    if dry_run:
        return pending_download(hub_id, WEIGHT_FILES)
    try:
        snapshot(hub_id, WEIGHT_FILES)
    except ValueError as exc:  # one line naming the id and the cache
        from hyper_parallel.errors import InputFileError, Issue

        raise InputFileError([Issue(field, str(exc), "")]) from None
    return None
