"""Device memory for ``--device-memory``: a size such as ``80GiB`` or a device name from a small table."""

import re
from typing import NamedTuple

__all__ = ["DEVICES", "Device", "parse_device"]

_MIB = 2**20


class Device(NamedTuple):
    """An accelerator's memory in bytes and, where published, its dense bf16/fp16 peak in FLOP/s.

    ``name`` is empty for a plain size given on the command line.
    """

    name: str
    memory: int
    peak_flops: float | None = None


#: Memory as the driver reports it (nvidia-smi / npu-smi totals); peaks are the vendors' dense bf16 figures.
DEVICES: dict[str, Device] = {
    "H100": Device("H100 80GB", 81_559 * _MIB, 989.4e12),
    "H200": Device("H200 141GB", 143_771 * _MIB, 989.4e12),
    "A100-40GB": Device("A100 40GB", 40_960 * _MIB, 312e12),
    "A100-80GB": Device("A100 80GB", 81_920 * _MIB, 312e12),
    "Ascend-910B": Device("Ascend 910B 64GB", 65_536 * _MIB),
}
_ALIASES = {
    "h10080gb": "H100",
    "h200141gb": "H200",
    "a10040gb": "A100-40GB",
    "a10080gb": "A100-80GB",
    "910b": "Ascend-910B",
    "910b64gb": "Ascend-910B",
    "ascend910b64gb": "Ascend-910B",
}
_UNITS = {"": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)")


def _key(text: str) -> str:
    return re.sub(r"[^0-9a-z]", "", text.lower())


def parse_device(text: str) -> Device:
    """A size (``80GiB`` = 80 * 2^30 bytes, ``80GB`` = 80 * 10^9; KiB/MiB/TiB, KB/MB/TB) or a device name.

    Names are matched ignoring case and punctuation (``h100``, ``A100-80GB``, ``ascend 910b``).

    Raises ``ValueError`` with a message naming the accepted forms.
    """
    size = _SIZE.fullmatch(text.strip().lower())
    if size and size.group(2) in _UNITS:
        if size.group(2) == "":
            raise ValueError(f"device memory {text!r} needs a unit, e.g. 80GiB or 80GB")
        nbytes = int(float(size.group(1)) * _UNITS[size.group(2)])
        if nbytes <= 0:
            raise ValueError(f"device memory must be positive, got {text!r}")
        return Device("", nbytes)
    names = {_key(name): name for name in DEVICES} | _ALIASES
    key = _key(text)
    if key in names:
        return DEVICES[names[key]]
    if key == "a100":
        raise ValueError("A100 comes with 40 or 80 GB: use A100-40GB or A100-80GB")
    raise ValueError(
        f"device memory {text!r} is neither a size (e.g. 80GiB, 80GB) nor a known device "
        f"({', '.join(DEVICES)})"
    )
