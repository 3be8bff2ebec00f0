"""Accelerators the project knows: memory for ``--device-memory`` and dense peaks for the trainer's MFU.

``--device-memory`` takes a size such as ``80GiB`` or a device name from the table; the trainer looks up the
peak FLOP/s of the device it runs on (:func:`peak_flops`, from the name the driver reports) to turn the
achieved TFLOP/s into model FLOPs utilisation; ``training.peak_tflops`` replaces the lookup.
"""

import re
from typing import NamedTuple

from hyper_parallel._numbers import read_size

__all__ = ["DEVICES", "Device", "parse_device", "peak_flops", "table_entry"]

_MIB = 2**20


class Device(NamedTuple):
    """An accelerator's memory in bytes and, where published, its dense peaks in FLOP/s.

    ``peak_flops``: bf16/fp16 matrix math; ``peak_flops_fp32``: float32 without TF32 (PyTorch's default for
    float32 matmuls). ``name`` is empty for a plain size given on the command line.
    """

    name: str
    memory: int
    peak_flops: float | None = None
    peak_flops_fp32: float | None = None


#: Memory as the driver reports it (nvidia-smi / npu-smi totals; B200 and MI300X: the nominal size); peaks are
#: the vendors' dense (no sparsity) figures for the SXM/OAM parts, and for the NVL (PCIe card) parts their
#: own: NVIDIA's H100 and H200 product pages list H100 NVL and H200 NVL at 1,671 TFLOPS BF16 with 2:4 sparsity
#: (835.5 dense) and 60 TFLOPS FP32, against the SXM parts' 1,979 (989.4 dense) and 67; H100 NVL holds 94 GB
#: (95,830 MiB as the driver reports it), H200 NVL 141 GB like H200 SXM. Ascend 910B comes in variants of
#: different clocks (910B1 to 910B4); the figure is the commonly quoted 910B fp16 peak: give
#: ``training.peak_tflops`` for another.
DEVICES: dict[str, Device] = {
    "H100": Device("H100 80GB", 81_559 * _MIB, 989.4e12, 66.9e12),
    "H100-PCIe": Device("H100 PCIe 80GB", 81_559 * _MIB, 756.5e12, 51.2e12),
    "H100-NVL": Device("H100 NVL 94GB", 95_830 * _MIB, 835.5e12, 60e12),
    "H200": Device("H200 141GB", 143_771 * _MIB, 989.4e12, 66.9e12),
    "H200-NVL": Device("H200 NVL 141GB", 143_771 * _MIB, 835.5e12, 60e12),
    "B200": Device("B200 180GB", 180 * 1024 * _MIB, 2250e12),
    "A100-40GB": Device("A100 40GB", 40_960 * _MIB, 312e12, 19.5e12),
    "A100-80GB": Device("A100 80GB", 81_920 * _MIB, 312e12, 19.5e12),
    "MI300X": Device("MI300X 192GB", 192 * 1024 * _MIB, 1307.4e12, 163.4e12),
    "Ascend-910B": Device("Ascend 910B 64GB", 65_536 * _MIB, 313e12),
}
#: Parts of the driver's device name (lower case, no punctuation) -> the table entry; the first match wins.
_DRIVER_NAMES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("h100", "pcie"), "H100-PCIe"),
    (("h100", "nvl"), "H100-NVL"),
    (("h100",), "H100"),
    (("h200", "nvl"), "H200-NVL"),
    (("h200",), "H200"),
    (("b200",), "B200"),
    (("a100", "40gb"), "A100-40GB"),
    (("a100",), "A100-80GB"),
    (("mi300x",), "MI300X"),
    (("910b",), "Ascend-910B"),
)
_ALIASES = {
    "h10080gb": "H100",
    "h100pcie80gb": "H100-PCIe",
    "h100nvl94gb": "H100-NVL",
    "h200141gb": "H200",
    "h200nvl141gb": "H200-NVL",
    "b200180gb": "B200",
    "mi300x192gb": "MI300X",
    "a10040gb": "A100-40GB",
    "a10080gb": "A100-80GB",
    "910b": "Ascend-910B",
    "910b64gb": "Ascend-910B",
    "ascend910b64gb": "Ascend-910B",
}


def _key(text: str) -> str:
    return re.sub(r"[^0-9a-z]", "", text.lower())


def parse_device(text: str) -> Device:
    """A size (``80GiB`` = 80 * 2^30 bytes, ``80GB`` = 80 * 10^9; KiB/MiB/TiB, KB/MB/TB) or a device name.

    Names are matched ignoring case and punctuation (``h100``, ``A100-80GB``, ``ascend 910b``).

    Raises ``ValueError`` with a message naming the accepted forms.
    """
    size = read_size(text)
    if size is not None and size[1] != "b":  # '910B' names a device
        nbytes, unit = size
        if unit == "":
            raise ValueError(f"device memory {text!r} needs a unit, e.g. 80GiB or 80GB")
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


def table_entry(driver_name: str) -> Device | None:
    """The table's device for a name as the driver reports it (``NVIDIA H100 80GB HBM3``, ``Ascend910B3``).

    None for a device the table does not hold (and for a CPU).
    """
    key = _key(driver_name)
    for parts, entry in _DRIVER_NAMES:
        if all(part in key for part in parts):
            return DEVICES[entry]
    return None


def peak_flops(driver_name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s of the named device computing in ``dtype`` (``bfloat16``, ``float16``, ``float32``).

    None when the device or its peak for that dtype is not in the table.
    """
    device = table_entry(driver_name)
    if device is None:
        return None
    return device.peak_flops_fp32 if dtype == "float32" else device.peak_flops
