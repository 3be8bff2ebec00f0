"""What this machine can run and which named files exist, read without importing torch.

``--dry-run`` must refuse what the run would refuse: a config asking for CUDA devices or the NCCL backend
on a machine without NVIDIA GPUs (or Ascend NPUs and HCCL without them) fails here, in milliseconds,
instead of on every rank after start-up. Accelerators are recognised by their driver's device files; a
metrics logger switched on without its package installed (TensorBoard, W&B) is refused the same way.
When about to train, and at ``--dry-run`` (unless ``--no-file-checks``: a config checked away from its
files), the files the config names (weights, tokenizer, data, initial checkpoint) are checked too, so a
typo in a path stops the launch before any model is built.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hyper_parallel._backends import BACKEND_DEVICE
from hyper_parallel._hub import CONFIG_FILES, TOKENIZER_FILES, is_hub_id, lookup_problem, snapshot
from hyper_parallel._numbers import read_world_size
from hyper_parallel._paths import entry_kinds, kind_problem

if TYPE_CHECKING:
    from hyper_parallel.trainer.config import TrainerConfig

__all__ = [
    "SUPPORTED_TORCH",
    "accelerator",
    "cpu_has_instructions_for",
    "intra_op_threads",
    "machine_issues",
    "machine_warnings",
    "torch_version_problem",
]

#: Device files each accelerator's driver creates.
_DEVICE_FILES = {"cuda": ("/dev/nvidia[0-9]*", "/proc/driver/nvidia/gpus/*"), "npu": ("/dev/davinci[0-9]*",)}
_DEVICE_NAMES = {"cuda": "NVIDIA GPU", "npu": "Ascend NPU"}


def accelerator() -> str:
    """``cuda``, ``npu`` or ``cpu``: the accelerator whose devices this machine has (CPU when none)."""
    for kind, patterns in _DEVICE_FILES.items():
        if any(glob.glob(pattern) for pattern in patterns):
            return kind
    return "cpu"


def intra_op_threads(
    configured: int | None,
    environ: Mapping[str, str] | None = None,
    cores: int | None = None,
    load: float | None = None,
) -> tuple[int, str]:
    """Threads each rank's torch uses inside one operation, and why (for the banner).

    ``training.cpu_threads`` when set, else ``OMP_NUM_THREADS`` when exported, else the cores this process
    may run on (its CPU affinity, which containers and schedulers restrict) that other processes leave
    free (less the 1-minute load average, ``load``), divided by the ranks on this node
    (``LOCAL_WORLD_SIZE``), and at least 1. Torch's own default counts every core of the machine for
    every rank; ranks sharing cores, or a machine shared with other work, then spend most of their time
    waiting for each other: README's first command took 8m45s with two threads on a 2-core machine that
    other jobs kept busy, 1m56s with one.
    """
    env = os.environ if environ is None else environ
    if configured is not None:
        return configured, "training.cpu_threads"
    exported = read_world_size(env.get("OMP_NUM_THREADS", ""))  # a positive count, as a world size is
    if exported is not None:
        return exported, "OMP_NUM_THREADS"
    if cores is None:
        affinity = getattr(os, "sched_getaffinity", None)
        cores = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # not on every platform
            load = 0.0
    ranks = read_world_size(env.get("LOCAL_WORLD_SIZE", "1")) or 1
    busy = min(cores, round(load))
    free = max(1, cores - busy)
    reason = f"{cores} cores available to this process"
    if busy:
        reason += f", {busy} busy (load {load:.2f})"
    return max(1, free // ranks), f"{reason} / {ranks} local rank(s)"


def machine_issues(cfg: TrainerConfig, *, training: bool, files: bool | None = None) -> list[tuple[str, str]]:
    """``(field path, message)`` for settings this machine cannot run; ``training`` adds the torch check,
    ``files`` (default: ``training``; ``--dry-run`` asks too) that every file the config names exists
    and has the right kind."""
    issues: list[tuple[str, str]] = []
    here = accelerator()
    device = cfg.training.init_device
    if device in _DEVICE_NAMES and device != here:
        issues.append(
            (
                "training.init_device",
                f"{device!r} needs an {_DEVICE_NAMES[device]}, and this machine has none; use 'meta' "
                "(allocates on the training device after sharding) or 'cpu'",
            )
        )
    backend = cfg.comm.backend
    if backend in BACKEND_DEVICE and BACKEND_DEVICE[backend] != here:
        issues.append(
            (
                "comm.backend",
                f"{backend!r} needs an {_DEVICE_NAMES[BACKEND_DEVICE[backend]]}, and this machine has "
                f"none; use null to pick {'gloo' if here == 'cpu' else backend} automatically",
            )
        )
    issues.extend(_missing_loggers(cfg))
    if training and not _torch_installed():
        issues.append(
            ("", "training needs PyTorch, which is not installed: python -m pip install -e '.[torch]'")
        )
    old_torch = torch_version_problem()
    if old_torch is not None:
        issues.append(("", old_torch))
    if training if files is None else files:
        issues.extend(_missing_files(cfg, fetch=training))
    return issues


def torch_version_problem() -> str | None:
    """Why the installed PyTorch cannot run this project (older than :data:`SUPPORTED_TORCH`), or None:
    the launch scripts, ``evaluate``, ``export`` and ``generate`` refuse it in these words."""
    version = _torch_version()
    if version is None or version[:2] >= SUPPORTED_TORCH[0]:
        return None
    return (
        f"PyTorch {_torch_version_text()} is older than {_supported_text()}, the range this project supports "
        "(FlexAttention, FSDP2 and DCP APIs it calls)"
    )


#: CPU feature flags (``/proc/cpuinfo``: x86 ``flags``, Arm ``Features``) that compute each dtype natively.
_DTYPE_FLAGS = {
    "bfloat16": frozenset({"avx512_bf16", "amx_bf16", "bf16"}),
    "float16": frozenset({"avx512_fp16", "amx_fp16", "fphp", "asimdhp"}),
}


def cpu_has_instructions_for(dtype: str, cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU computes ``dtype`` with its own instructions; None when it cannot be told (no
    ``/proc/cpuinfo``). Without them torch emulates the dtype: ``configs/llama3_debug.yaml`` with
    ``bfloat16`` took 6.7 s of CPU per step against 0.45 s with ``float32`` (15x) with oneDNN held to AVX2
    (``ONEDNN_MAX_CPU_ISA=AVX2``) on a CPU that has them."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    if not flags:
        return None
    return bool(flags & _DTYPE_FLAGS[dtype])


def machine_warnings(cfg: TrainerConfig, cpuinfo: str | None = None) -> list[tuple[str, str]]:
    """``(field path, message)`` for settings this machine runs, but at a cost worth a word: a
    reduced-precision compute dtype on a CPU without instructions for it (the default ``bfloat16``), and
    a PyTorch newer than the supported range (untested, not refused)."""
    found = []
    version = _torch_version()
    if version is not None and version[:2] >= SUPPORTED_TORCH[1]:
        found.append(("", f"PyTorch {_torch_version_text()} is newer than {_supported_text()}, the range "
                          "this project is tested on"))  # fmt: skip
    dtype = cfg.training.mixed_precision_param
    if dtype == "float32" or accelerator() != "cpu" or cpu_has_instructions_for(dtype, cpuinfo) is not False:
        return found
    return [
        *found,
        (
            "training.mixed_precision_param",
            f"{dtype!r} on this CPU, which has no {dtype} instructions, is emulated: about 15x slower than "
            "'float32' (measured on configs/llama3_debug.yaml); set it to 'float32' to train on the CPU",
        ),
    ]


#: The PyTorch releases this project supports, ``[low, high)`` as (major, minor): the ``torch`` extra of
#: pyproject.toml states the same range (a test holds them together).
SUPPORTED_TORCH = ((2, 11), (2, 14))


def _supported_text() -> str:
    (a, b), (c, d) = SUPPORTED_TORCH
    return f"{a}.{b} to {c}.{d - 1}"


def _torch_version_text() -> str | None:
    """The installed PyTorch's version, read from its ``torch/version.py`` as text: neither torch nor
    ``importlib.metadata`` (which scans every installed distribution) is imported at ``--dry-run``."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    try:
        text = Path(spec.origin).with_name("version.py").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return found.group(1) if found else None


def _torch_version() -> tuple[int, ...] | None:
    text = _torch_version_text()
    if text is None:
        return None
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def _torch_installed() -> bool:
    return importlib.util.find_spec("torch") is not None


#: Logger switch of the metrics config -> (the package it needs, its name, the extra that installs it).
_LOGGERS = {
    "enable_tensorboard": ("tensorboard", "TensorBoard", "tensorboard"),
    "enable_wandb": ("wandb", "Weights & Biases", "wandb"),
}


def _installed(package: str) -> bool:
    """Whether ``package`` can be imported (looked up, never imported: importing wandb takes seconds)."""
    return importlib.util.find_spec(package) is not None


def _missing_loggers(cfg: TrainerConfig) -> Iterator[tuple[str, str]]:
    for switch, (package, name, extra) in _LOGGERS.items():
        if getattr(cfg.metrics, switch, False) and not _installed(package):
            yield (
                f"metrics.{switch}",
                f"{name} is not installed: python -m pip install -e '.[{extra}]', or set it to false",
            )


def _named_paths(cfg: TrainerConfig) -> Iterator[tuple[str, str, bool]]:
    """``(field path, file system path, must be a directory)`` for every input the run will read."""
    if cfg.model.weights_path is not None:
        yield "model.weights_path", cfg.model.weights_path, True
    if cfg.tokenizer.path is not None:
        yield "tokenizer.path", cfg.tokenizer.path, False
    sections = [("dataloader.dataset", getattr(cfg.dataloader, "dataset", None))]
    if cfg.validator.enable:
        sections.append(("validator.dataset", getattr(cfg.validator, "dataset", None)))
    for where, dataset in sections:
        for index, path in enumerate(getattr(dataset, "paths", ())):
            yield f"{where}.paths[{index}]", path, False
    if cfg.checkpoint.initial_load_path is not None:  # read with or without checkpoint.enable
        yield "checkpoint.initial_load_path", cfg.checkpoint.initial_load_path, True


#: The fields that take a Hugging Face Hub id, and what each needs of its repository.
_HUB_FILES = {"model.weights_path": CONFIG_FILES, "tokenizer.path": TOKENIZER_FILES}


def _hub_problem(hub_id: str, patterns: list[str], *, fetch: bool) -> str | None:
    """Why ``hub_id``'s files cannot be had (one line naming both readings of the path and the cache), or
    None: in the cache, or (online) fetched when ``fetch`` (the launch: the small files the resolve and the
    tokenizer read, never the weights), else found on the Hub without downloading (``--dry-run``)."""
    if not fetch:
        return lookup_problem(hub_id, patterns)
    try:
        snapshot(hub_id, patterns)
    except ValueError as exc:
        return str(exc)
    return None


def _missing_files(cfg: TrainerConfig, *, fetch: bool) -> Iterator[tuple[str, str]]:
    for field, raw, directory in _named_paths(cfg):
        path = Path(raw)
        if field in _HUB_FILES and is_hub_id(raw):  # no such path here: a Hub id, had from its cache
            if (problem := _hub_problem(raw, _HUB_FILES[field], fetch=fetch)) is not None:
                yield field, problem
        elif (problem := kind_problem(path)) is not None:
            yield field, f"{raw!r} {problem}"
        elif directory and not path.is_dir():
            yield field, f"{raw!r} is not a directory on this machine"
        elif not path.exists():
            yield field, f"{raw!r} does not exist on this machine"
        elif path.is_dir():
            yield from ((field, problem) for problem in entry_kinds(path))
    metrics_file = (
        getattr(cfg.metrics, "jsonl_path", None) if getattr(cfg.metrics, "enable_jsonl", False) else None
    )
    if metrics_file is not None and (problem := kind_problem(metrics_file)) is not None:
        yield "metrics.jsonl_path", f"{metrics_file!r} {problem}"
