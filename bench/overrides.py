"""Distinct, valid command-line overrides generated from a resolved config's own fields.

Every overridable field (``hyper_parallel.config.help.iter_fields``) gets one command-line string: a
changed value when one is known to stay valid (a flipped boolean, a larger integer, a longer string ...),
else its current value spelled as on a command line. Each candidate is checked alone with
``apply_overrides`` and the final set is checked together, so a benchmark never times an error path.
Groups are interleaved so the first 10 overrides touch 10 different groups.
"""

import json
from collections import defaultdict
from typing import Any

from hyper_parallel.config import ConfigError, apply_overrides
from hyper_parallel.config.help import iter_fields
from hyper_parallel.config.targets import TARGET_KEY

__all__ = ["generate_overrides"]


def _text(value: Any) -> str:
    """A value as typed on a command line (YAML 1.2 flow syntax)."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(list(value) if not isinstance(value, dict) else value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _candidates(value: Any) -> list[Any]:
    if value is True or value is False:
        return [not value, value]
    if isinstance(value, int):
        return [value * 2 if value > 0 else value, value]
    if isinstance(value, float):
        return [value / 2 if value > 0 else value, value]
    if isinstance(value, str):
        return [f"{value}_x", value]
    return [value]


def generate_overrides(cfg: Any, count: int = 100) -> list[tuple[str, str]]:
    """Up to ``count`` ``(dotted key, command-line text)`` pairs, valid alone and all together."""
    by_group: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for info in iter_fields(cfg):
        if info.path.endswith(TARGET_KEY):
            continue
        for candidate in _candidates(info.value):
            text = _text(candidate)
            try:
                apply_overrides(cfg, {info.path: text})
            except ConfigError:
                continue
            by_group[info.path.partition(".")[0]].append((info.path, text))
            break
    interleaved: list[tuple[str, str]] = []
    queues = [list(q) for q in by_group.values()]
    while any(queues):
        for q in queues:
            if q:
                interleaved.append(q.pop(0))
    chosen = interleaved[:count]
    # Changes valid alone may clash together (a cross-field check): fall back to the current value there.
    current = {info.path: _text(info.value) for info in iter_fields(cfg)}
    for _ in range(len(chosen)):
        try:
            apply_overrides(cfg, dict(chosen))
            return chosen
        except ConfigError as exc:
            bad = {issue.path.removeprefix("$.") for issue in exc.issues}
            fixed = [(k, current[k]) if k in bad else (k, v) for k, v in chosen]
            # First fall back to current values; if that changed nothing, drop the clashing keys.
            chosen = fixed if fixed != chosen else [(k, v) for k, v in chosen if k not in bad]
    apply_overrides(cfg, dict(chosen))
    return chosen
