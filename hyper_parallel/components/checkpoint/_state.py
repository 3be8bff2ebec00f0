"""What a checkpoint holds: the state dicts saved and restored, by part (part of ``Checkpoint``).

Two kinds of checkpoint:

- **full** (every save but the final one with ``last_save_model_only``): ``model`` and ``optimizer``
  (tensors, through ``torch.distributed.checkpoint.state_dict`` so sharded models work), ``lr_scheduler``
  (its position), ``step``, and per rank ``r``: ``dataloader.rank<r>`` (data position), ``rng.rank<r>``
  (Python ``random``, torch CPU and, when CUDA is in use, the current CUDA device's generator, the torch
  states as base64) and ``train_state.rank<r>`` (the trainer's own stateful). Resuming from one continues
  the run exactly.
- **weights-only export** (the final save with ``last_save_model_only``): ``model`` alone, cast to
  ``export_dtype``. It is for other tools and for ``initial_load_path``; it is never resumed, because
  resuming it would replay data with fresh optimizer state and a restarted warmup.

Everything but the model and optimizer tensors is JSON, saved as a 1-D ``uint8`` tensor of its UTF-8
text: DCP stores tensors as data, while any other object would be pickled and read back with
``torch.load(weights_only=False)``. Checkpoints of earlier versions hold these parts as pickled JSON
strings; ``_safe_read`` reads those with torch's restricted loader, as strings only.

Resharding: model and optimizer state are saved by fully qualified name (optimizer state keyed by
parameter FQN), so DCP reads them into any layout (FSDP2, tensor parallelism, one process) whatever layout
saved them. Per-rank parts are read from this rank's entry, else from rank 0's (a run resumed on more
processes than saved it); the data loader translates a position saved under another data-parallel size
(see its ``load_state_dict``) and a position it cannot continue identically stops the resume with
``CheckpointNotResumableError``.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.distributed.checkpoint.metadata import STORAGE_TYPES, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from hyper_parallel._dtypes import torch_dtype
from hyper_parallel._json import loads
from hyper_parallel.components.checkpoint import CheckpointNotResumableError
from hyper_parallel.components.checkpoint._bounds import MAX_JSON_BYTES
from hyper_parallel.components.checkpoint._manifest import UnreadableCheckpointError
from hyper_parallel.parallel.names import unwrapped_name

__all__ = ["Stateful", "TrainingState", "decode_json", "encode_json", "is_full", "model_shape_differences"]

_PER_RANK = ("dataloader", "rng", "train_state")


class Stateful(Protocol):
    """What the trainer passes as ``train_state``: rank-local, JSON-serialisable state."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def encode_json(value: Any) -> torch.Tensor:
    """``value`` as JSON in a 1-D ``uint8`` tensor (how every non-tensor part is saved)."""
    return torch.frombuffer(bytearray(json.dumps(value).encode("utf-8")), dtype=torch.uint8)


def decode_json(saved: torch.Tensor | str) -> Any:
    """The JSON value of a saved part: a ``uint8`` tensor of UTF-8 text, or (older checkpoints) a string."""
    if isinstance(saved, str):
        return loads(saved)
    return loads(saved.numpy().tobytes().decode("utf-8"))


def _placeholder(item: STORAGE_TYPES) -> torch.Tensor | str:
    """What DCP loads a saved JSON part into: a tensor of its saved size, or a string (older layout)."""
    if isinstance(item, TensorStorageMetadata):
        # ``_bounds.check_declared`` (in every ``inspect``) refused anything else; checked again here so
        # that no declared size decides an allocation whoever calls this.
        size = tuple(item.size)
        if len(size) != 1 or item.properties.dtype != torch.uint8 or not 0 <= size[0] <= MAX_JSON_BYTES:
            raise UnreadableCheckpointError(f"a JSON part declared {item.properties.dtype} {list(size)}")
        return torch.zeros(size, dtype=torch.uint8)
    return ""


#: Differing tensors a message names (a model of another depth differs in every layer).
_SHOWN = 6


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def model_shape_differences(
    model: Mapping[str, Any], items: Mapping[str, STORAGE_TYPES], unread: AbstractSet[str] = frozenset()
) -> list[str]:
    """How the model's tensors (``model``: its state dict) differ from those a checkpoint saved.

    ``items`` is the checkpoint's ``state_dict_metadata``; sizes are global (a sharded ``DTensor``'s
    full shape), so a checkpoint of another layout of the same model shows no difference. Each entry names
    tensors (by the model's names): sizes that differ, tensors the checkpoint lacks, tensors only it holds
    (except those in ``unread``: the model's frozen parameters a LoRA run does not restore).
    """
    ours = {name: list(value.shape) for name, value in model.items() if torch.is_tensor(value)}
    saved = {
        key.removeprefix("model."): list(item.size)
        for key, item in items.items()
        if key.startswith("model.") and isinstance(item, TensorStorageMetadata)
    }
    found: list[str] = []
    missing = [name for name in ours if name not in saved]
    if missing:
        found.append(f"it lacks {_listed(missing)}")
    extra = sorted(name for name in saved if name not in ours and name not in unread)
    if extra:
        found.append(f"it holds {_listed(extra)}, which the model has not")
    found += [
        f"{name} is {saved[name]} there, {shape} here"
        for name, shape in ours.items()
        if name in saved and saved[name] != shape
    ]
    if len(found) > _SHOWN:
        found = [*found[:_SHOWN], f"{len(found) - _SHOWN} more tensors differ"]
    return found


def is_full(keys: set[str]) -> bool:
    """Whether a checkpoint's keys are those of a full (resumable) checkpoint, not a weights-only export."""
    return "step" in keys


def _saved_rank(part: str, keys: set[str], rank: int) -> str | None:
    """The entry of a per-rank ``part`` this process restores: its own rank's, else rank 0's, else None."""
    for entry in (f"rank{rank}", "rank0"):
        if f"{part}.{entry}" in keys:
            return entry
    return None


def _only_entry(loaded: dict[str, Any]) -> Any:
    """The JSON value of the one per-rank entry a load asked for."""
    (saved,) = loaded.values()
    return decode_json(saved)


# -- random number generators ---------------------------------------------------------------------------
def _bytes_text(state: torch.Tensor) -> str:
    return base64.b64encode(bytes(state.tolist())).decode("ascii")


def _text_bytes(text: str) -> torch.Tensor:
    return torch.tensor(list(base64.b64decode(text)), dtype=torch.uint8)


def _rng_state() -> dict[str, Any]:
    """This process's generator states as JSON: Python ``random``, torch CPU, the current CUDA device."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "torch": _bytes_text(torch.get_rng_state()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = _bytes_text(torch.cuda.get_rng_state())
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(_text_bytes(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(_text_bytes(state["cuda"]))


class TrainingState:
    """The objects a checkpoint saves and restores, and their state dicts by part.

    ``model`` is required; ``optimizer``, ``lr_scheduler``, ``dataloader`` and ``train_state`` are saved
    when given. ``rank`` names this process's per-rank entries.
    """

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        dataloader: Any = None,
        train_state: Stateful | None = None,
        rank: int = 0,
        save_frozen: bool = True,
    ) -> None:
        self.model, self.optimizer = model, optimizer
        self.lr_scheduler, self.dataloader, self.train_state = lr_scheduler, dataloader, train_state
        self.rank = rank
        self.save_frozen = save_frozen

    def model_state(self) -> dict[str, Any]:
        """``{"model": ...}``: the model's state dict by fully qualified name (sharded or not).

        Without ``save_frozen`` the parameters that do not train are left out (a LoRA run whose base is
        built again at every start: ``PEFT.Config.checkpoint_holds_base``).
        """
        options = StateDictOptions(ignore_frozen_params=not self.save_frozen)
        state = get_model_state_dict(self.model, options=options)
        frozen = self.frozen_names()  # a tied frozen matrix too, under each of its names
        return {"model": {name: value for name, value in state.items() if name not in frozen}}

    def frozen_names(self) -> set[str]:
        """Names of the parameters ``model_state`` leaves out (none with ``save_frozen``)."""
        if self.save_frozen:
            return set()
        return {
            unwrapped_name(name)
            for name, param in self.model.named_parameters(remove_duplicate=False)
            if not param.requires_grad
        }

    def full(self, step: int) -> dict[str, Any]:
        """Everything a full checkpoint of ``step`` holds (see the module docstring)."""
        rank = f"rank{self.rank}"
        state = self.model_state()
        if self.optimizer is not None:
            state["optimizer"] = get_optimizer_state_dict(self.model, self.optimizer)
        if self.lr_scheduler is not None:
            state["lr_scheduler"] = encode_json(self.lr_scheduler.state_dict())
        if self.dataloader is not None:
            state["dataloader"] = {rank: encode_json(self.dataloader.state_dict())}
        state["rng"] = {rank: encode_json(_rng_state())}
        if self.train_state is not None:
            state["train_state"] = {rank: encode_json(self.train_state.state_dict())}
        state["step"] = encode_json(step)
        return state

    def export(self, dtype: str) -> dict[str, Any]:
        """The weights-only export: the model's floating-point tensors cast to ``dtype``."""
        cast = torch_dtype(dtype)
        model = self.model_state()["model"]
        return {
            "model": {
                k: v.to(cast) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in model.items()
            }
        }

    def wanted(
        self, path: Path, items: Mapping[str, STORAGE_TYPES], exclude: tuple[str, ...]
    ) -> dict[str, Any]:
        """Placeholders of the parts to restore from the full checkpoint at ``path``; refuses missing ones.

        ``items`` is the checkpoint's ``state_dict_metadata`` (what each saved key is, and its size).
        Parts in ``exclude`` (and parts this state has no object for) are left out. A per-rank part is read
        from this rank's entry, or from rank 0's when the checkpoint was saved by fewer processes (a resume
        on another layout): every rank is at the same step and data position then, and the trainer seeds
        every rank alike.
        """
        owners: dict[str, Any] = {
            "optimizer": self.optimizer,
            "lr_scheduler": self.lr_scheduler,
            "dataloader": self.dataloader,
            "rng": True,
            "train_state": self.train_state,
        }
        keys = set(items)
        wanted: dict[str, Any] = {}
        for part, owner in owners.items():
            if owner is None or part in exclude:
                continue
            if part in _PER_RANK:
                entry = _saved_rank(part, keys, self.rank)
                present = entry is not None
                wanted_value: Any = {entry: _placeholder(items[f"{part}.{entry}"])} if present else None
            elif part == "optimizer":
                present = any(key.startswith("optimizer.") for key in keys)
                wanted_value = None
            else:
                present = part in keys
                wanted_value = _placeholder(items[part]) if present else None
            if not present:
                raise ValueError(
                    f"checkpoint {str(path)!r} holds no {part!r} state; add {part!r} to "
                    "checkpoint.exclude_from_loading to start it fresh"
                )
            wanted[part] = wanted_value
        return wanted

    def placeholders(self, wanted: dict[str, Any], items: Mapping[str, STORAGE_TYPES]) -> dict[str, Any]:
        """The state dict DCP loads into for the ``wanted`` parts (the model always, the step)."""
        state = self.model_state()
        if "optimizer" in wanted:
            state["optimizer"] = get_optimizer_state_dict(self.model, self.optimizer)  # type: ignore[arg-type]
        state.update({part: value for part, value in wanted.items() if part != "optimizer"})
        state["step"] = _placeholder(items["step"])
        return state

    def restore_model(self, state: dict[str, Any]) -> None:
        """Load the model part of a loaded state dict (every key ``model_state`` gives must be there)."""
        set_model_state_dict(self.model, state["model"], options=StateDictOptions(strict=self.save_frozen))

    def restore(self, path: Path, state: dict[str, Any]) -> int:
        """Load every part of a loaded full state dict into its object; returns the saved step."""
        self.restore_model(state)
        if "optimizer" in state:
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])  # type: ignore[arg-type]
        if self.lr_scheduler is not None:
            if "lr_scheduler" in state:
                self.lr_scheduler.load_state_dict(decode_json(state["lr_scheduler"]))
            if self.optimizer is not None:  # the scheduler's lr, not the one saved with the optimizer
                for group, lr in zip(
                    self.optimizer.param_groups, self.lr_scheduler.get_last_lr(), strict=True
                ):
                    group["lr"] = lr
        if "dataloader" in state:
            try:
                self.dataloader.load_state_dict(_only_entry(state["dataloader"]))
            except ValueError as exc:  # a data position this run cannot continue (another layout, data)
                raise CheckpointNotResumableError(f"checkpoint {str(path)!r}: {exc}") from None
        if "train_state" in state:
            self.train_state.load_state_dict(_only_entry(state["train_state"]))  # type: ignore[union-attr]
        if "rng" in state:
            _set_rng_state(_only_entry(state["rng"]))
        return int(decode_json(state["step"]))
