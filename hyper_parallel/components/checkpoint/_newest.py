"""The newest step of a checkpoint folder that reads: the one search of every reader of a live folder.

``export``, ``generate`` and ``evaluate`` take a ``step-<N>`` folder or a ``checkpoint.folder``; given the
latter they read its newest complete step, while the run that saves into it may still be training. Two
things then go wrong that a listing cannot show, and both are handled here, once, for every reader:

- a step that passes its inspection fails only when read (a tensor chunk that is a pickle, a value of the
  wrong type, a file truncated after the listing): it is skipped, with one warning naming the step and
  the problem, for the next older step, as the trainer's resume skips it
  (``_manager.CheckpointManager.load``);
- a step vanishes while it is read (the run saved a newer step and pruned this one): that is no damage,
  so the folder is listed again and its newest step read, at most :data:`ATTEMPTS` times (a run saving
  faster than a step can be read would otherwise keep the reader going forever).

The caller's ``read(step)`` does the reading; it signals a step that cannot be read by raising
``UnreadableCheckpointError`` or ``OSError`` (anything else is the caller's own error and passes through).
When no step reads, :class:`NoReadableStepError` says why in one line, naming the folder. File
operations only: torch is imported by the caller's ``read``, never here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from hyper_parallel.components.checkpoint._layout import CheckpointFolderError, complete_steps
from hyper_parallel.components.checkpoint._manifest import UnreadableCheckpointError

__all__ = ["ATTEMPTS", "NoReadableStepError", "candidates", "newest_readable"]

#: Times a live folder is listed again when the step being read vanished under the reader.
ATTEMPTS = 5
_log = logging.getLogger(__name__)
_T = TypeVar("_T")


class NoReadableStepError(ValueError):
    """No step of the folder (or the one step given) can be read; the message is one line naming it."""


def candidates(path: Path) -> list[Path]:
    """The step folders to try, newest first: ``path`` itself, or the complete steps of a folder of them."""
    if not path.is_dir():
        raise NoReadableStepError(f"{str(path)!r}: no such folder")
    if (path / ".metadata").is_file():
        return [path]
    found = [path / f"step-{step}" for step in reversed(complete_steps(path))]
    if not found:
        raise NoReadableStepError(
            f"{str(path)!r} is not a checkpoint: it holds neither a DCP '.metadata' file nor a complete "
            "step-<N> folder"
        )
    return found


def newest_readable(path: Path, read: Callable[[Path], _T], *, purpose: str) -> tuple[Path, _T]:
    """The step folder read and what ``read`` returned for it: ``path``, or its newest step that reads.

    ``purpose`` ends the message when no step reads (``"no intact checkpoint to {purpose}"``). A step
    folder given directly is not searched past: its failure is the error (``'STEP' is damaged: ...``).
    """
    problems: list[str] = []
    for _attempt in range(ATTEMPTS):
        steps = candidates(path)
        problems = []
        for step in steps:
            try:
                return step, read(step)
            except (UnreadableCheckpointError, OSError) as exc:
                problem = str(exc)
            if len(steps) == 1 and step == path:
                if not step.is_dir():
                    raise NoReadableStepError(f"{str(step)!r}: removed while it was read") from None
                raise NoReadableStepError(f"{str(step)!r} is damaged: {problem}") from None
            if _vanished(path, step, steps):
                _log.warning("%s was removed while it was read: reading the newest step again", step)
                break
            _log.warning("skipping the damaged checkpoint %s: %s", step.name, problem)
            problems.append(problem)
        else:
            raise NoReadableStepError(
                f"{str(path)!r}: no intact checkpoint to {purpose} ({'; '.join(problems)})"
            )
    raise NoReadableStepError(
        f"{str(path)!r}: its steps kept vanishing while they were read ({ATTEMPTS} tries)"
    )


def _vanished(path: Path, step: Path, steps: list[Path]) -> bool:
    """Whether ``step`` was removed (or a newer step published) since ``path`` was listed as ``steps``."""
    try:
        now = [path / f"step-{n}" for n in reversed(complete_steps(path))]
    except (CheckpointFolderError, OSError):
        return False
    return step not in now or now[:1] != steps[:1]
