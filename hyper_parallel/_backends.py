"""The collective backends and the devices they run on, stated once.

Three places ask: the resolver's rule that a device-specific backend runs on its own devices only
(``trainer/rules.py``), the machine check that this machine has those devices (``trainer/machine.py``,
at ``--dry-run``), and the process group that picks a backend for the device when ``comm.backend`` is null
(``parallel/process_group.py``). This module imports nothing, so the torch-free config layer may read it.
"""

__all__ = ["BACKEND_DEVICE", "DEFAULT_BACKEND"]

#: Backend picked for each device type when ``comm.backend`` is null.
DEFAULT_BACKEND: dict[str, str] = {"cuda": "nccl", "npu": "hccl", "cpu": "gloo"}
#: Accelerator each device-specific backend runs on (gloo runs on any device).
BACKEND_DEVICE: dict[str, str] = {
    backend: device for device, backend in DEFAULT_BACKEND.items() if device != "cpu"
}
