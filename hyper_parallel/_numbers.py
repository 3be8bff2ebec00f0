"""The one reader of each kind of number a user writes as text: byte sizes (``80GiB`` is 80 * 2^30, ``5GB``
5 * 10^9, ``500MiB``, ``100b`` or a bare ``100`` bytes), read by ``--device-memory`` and ``export
--max-shard-size``, and world sizes (``--world-size``, ``$WORLD_SIZE``), read by every launch command and by
``python -m hyper_parallel.config check``: the same text means the same number everywhere."""

import re

__all__ = ["UNIT_NAMES", "read_size", "read_world_size"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)")
#: The units, as a message names them.
UNIT_NAMES = "KB, MB, GB, TB, KiB, MiB, GiB, TiB"


def read_size(text: str) -> tuple[int, str] | None:
    """``(bytes, unit as written, lower case)`` of ``text``, or None if it is not a size."""
    size = _SIZE.fullmatch(text.strip().lower())
    if size is None or size.group(2) not in _UNITS:
        return None
    number = float(size.group(1)) * _UNITS[size.group(2)]
    if not number < 2**63:  # 400 digits read as infinity: no byte count is that large
        return None
    return int(number), size.group(2)


#: ASCII digits only (``"²".isdigit()`` is true but ``int()`` refuses it), and few of them (``int()`` refuses
#: 4300 and more).
_WORLD_SIZE = re.compile(r"[0-9]{1,9}")


def read_world_size(text: str) -> int | None:
    """The number of processes ``text`` gives, or None if it is not a positive integer."""
    text = text.strip()
    return int(text) if _WORLD_SIZE.fullmatch(text) and int(text) >= 1 else None
