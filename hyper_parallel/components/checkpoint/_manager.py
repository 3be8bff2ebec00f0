"""Runtime of ``hyper_parallel.components.checkpoint``: a checkpoint manager over torch DCP.

Imported only from ``Checkpoint.Config.build``; this module imports torch.

Layout: ``folder/step-<N>/`` holds one DCP checkpoint. A save writes into ``folder/.step-<N>.partial``;
DCP's coordinator writes ``.metadata`` only after every rank has written its data, and rank 0 then renames
the folder to ``step-<N>``. Only ``step-<N>`` folders holding ``.metadata`` count as complete: a kill
mid-save leaves a ``.partial`` folder (or, from older layouts, a ``step-<N>`` folder without
``.metadata``); neither is ever loaded, and rank 0 removes both when the manager starts.

Every published ``step-<N>`` folder also holds ``config.yaml``, the resolved config of the run that saved
it (``dump_config``; when the trainer passes it as ``run_config``), which ``hyper_parallel.export`` reads
to rebuild the model's Hugging Face layout.

Resharding: model and optimizer state are saved by fully qualified name through
``torch.distributed.checkpoint.state_dict`` (optimizer state keyed by parameter FQN), so DCP reads them
into any layout (FSDP2, tensor parallelism, one process) whatever layout saved them. Per-rank parts are
read from this rank's entry, else from rank 0's (a run resumed on more processes than saved it); the data
loader translates a position saved under another data-parallel size (see its ``load_state_dict``) and a
position it cannot continue identically stops the resume with ``CheckpointNotResumableError``.

Two kinds of checkpoint:

- **full** (every save but the final one with ``last_save_model_only``): ``model`` and ``optimizer``
  (tensors, through ``torch.distributed.checkpoint.state_dict`` so sharded models work), ``lr_scheduler``
  (its position, JSON), ``step`` (JSON), and per rank ``r``, as JSON: ``dataloader.rank<r>`` (data
  position), ``rng.rank<r>`` (Python ``random``, torch CPU and, when CUDA is in use, the current CUDA
  device's generator) and ``train_state.rank<r>`` (the trainer's own stateful). Resuming from one
  continues the run exactly.
- **weights-only export** (the final save with ``last_save_model_only``): ``model`` alone, cast to
  ``export_dtype``. It is for other tools and for ``initial_load_path``; it is never resumed, because
  resuming it would replay data with fresh optimizer state and a restarted warmup.

``load()`` therefore resumes from full checkpoints only. When the checkpoint it picks (the newest, or
``load_step``) is an export at step ``N``: with ``N >= max_steps`` (or ``max_steps`` unknown) the run is
finished and ``N`` is returned with nothing loaded; when ``max_steps`` was raised past ``N``, the newest
full checkpoint before ``N`` is resumed (a warning says so), and with none left (or ``load_step`` naming
the export) ``CheckpointNotResumableError`` says what to change.

Process groups: with torch.distributed initialised the manager creates one gloo group of all ranks and
runs every DCP collective and barrier on it, never on the default group. An ``async`` save stages the state
in host memory (training goes on at once) and writes it from a background thread whose collectives stay on
that group, so they cannot interleave with FSDP's collectives on the default group. Its completion on rank
0 means every rank has written and ``.metadata`` exists, so rank 0 publishes it (rename and prune, file
operations only) as soon as it sees it done: polled after each step by ``maybe_save``, and waited for by
the next save, ``load``, ``wait`` and ``close``; no collective runs from the training thread while a save
is in flight. ``async_with_pinned_mem`` stages through pinned memory on CUDA and is plain ``async`` on a
CPU-only machine (there is no device-to-host copy to speed up).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import random
import re
import shutil
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from hyper_parallel.components.checkpoint import CheckpointNotResumableError

if TYPE_CHECKING:
    from hyper_parallel.components.checkpoint import DCPCheckpoint

__all__ = ["CONFIG_FILE", "CheckpointManager", "Stateful", "complete_steps"]

#: The resolved config a checkpoint was saved with, as YAML, in every ``step-<N>`` folder (when known).
CONFIG_FILE = "config.yaml"

_log = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"step-(\d+)")
_PARTIAL_DIR = re.compile(r"\.step-(\d+)\.partial")
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_PER_RANK = ("dataloader", "rng", "train_state")

_SINGLE_PROCESS = (
    r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent is to "
    r"(save|load) in a single process"
)
# Without a process group DCP runs as a single process, which is the intent, yet it warns on every save
# and load. Synchronous calls silence it locally (_single_process_ok); the background thread of an
# asynchronous save is out of reach of catch_warnings, hence this narrow process-wide filter.
warnings.filterwarnings("ignore", message=_SINGLE_PROCESS, category=UserWarning)


class Stateful(Protocol):
    """What the trainer passes as ``train_state``: rank-local, JSON-serialisable state."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


@contextlib.contextmanager
def _single_process_ok() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SINGLE_PROCESS, category=UserWarning)
        yield


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def complete_steps(folder: str | Path) -> list[int]:
    """Steps with a complete (published) checkpoint in ``folder``, oldest first."""
    root = Path(folder)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        match = _STEP_DIR.fullmatch(child.name)
        if match and (child / ".metadata").is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def _saved_keys(path: Path) -> set[str]:
    return set(FileSystemReader(str(path)).read_metadata().state_dict_metadata)


def _saved_rank(part: str, keys: set[str]) -> str | None:
    """The entry of a per-rank ``part`` this process restores: its own rank's, else rank 0's, else None."""
    for entry in (f"rank{_rank()}", "rank0"):
        if f"{part}.{entry}" in keys:
            return entry
    return None


def _only_entry(loaded: dict[str, Any]) -> Any:
    """The JSON value of the one per-rank entry a load asked for."""
    (text,) = loaded.values()
    return json.loads(text)


def _is_full(keys: set[str]) -> bool:
    """Whether a checkpoint's keys are those of a full (resumable) checkpoint, not a weights-only export."""
    return "step" in keys


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


class _InFlight:
    """An asynchronous save: its future and where it is published once finished."""

    def __init__(self, future: Any, partial: Path, final: Path) -> None:
        # A staged save returns an AsyncSaveResponse whose upload_completion is the write.
        self.future: Future[Any] = getattr(future, "upload_completion", future)
        self.partial, self.final = partial, final


class CheckpointManager:
    """Saves and restores training state; see the module docstring for the layout and guarantees.

    The trainer calls ``load()`` once after building everything, ``maybe_save(step, last_step=...)``
    after every optimizer step, ``save(step)`` to save outside the interval (for example on SIGTERM),
    and ``close()`` before exiting (it finishes and publishes a save still in flight).
    """

    def __init__(
        self,
        cfg: DCPCheckpoint.Config | Any,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        dataloader: Any = None,
        train_state: Stateful | None = None,
        max_steps: int | None = None,
        run_config: Any = None,
    ) -> None:
        self.cfg = cfg
        self.run_config = run_config
        self._run_config_yaml: str | None = None
        self.folder = Path(cfg.folder)
        self.model, self.optimizer = model, optimizer
        self.lr_scheduler, self.dataloader, self.train_state = lr_scheduler, dataloader, train_state
        self.max_steps = max_steps
        self._in_flight: _InFlight | None = None
        self._saved: tuple[int, bool] | None = None  # (step, model_only) of this manager's newest save
        self._stager: Any = None
        # Every rank builds the manager with the same config, so every rank creates the group (a
        # collective) or none does.
        uses_files = cfg.enable or cfg.initial_load_path is not None
        self._group: Any = dist.new_group(backend="gloo") if uses_files and _distributed() else None
        if cfg.enable:
            self._remove_incomplete()

    # -- helpers --------------------------------------------------------------------------------------
    def _barrier(self) -> None:
        if self._group is not None:
            dist.barrier(group=self._group)

    def _dcp_kwargs(self) -> dict[str, Any]:
        if self._group is None:
            return {"no_dist": True}
        return {"process_group": self._group}

    def _remove_incomplete(self) -> None:
        """Rank 0 deletes ``.step-N.partial`` folders and ``step-N`` folders without ``.metadata``."""
        if _rank() == 0 and self.folder.is_dir():
            for child in self.folder.iterdir():
                step_dir = _STEP_DIR.fullmatch(child.name) and not (child / ".metadata").is_file()
                if child.is_dir() and (step_dir or _PARTIAL_DIR.fullmatch(child.name)):
                    _log.warning("removing incomplete checkpoint folder %s", child)
                    shutil.rmtree(child, ignore_errors=True)
        self._barrier()

    # -- when -----------------------------------------------------------------------------------------
    def should_save(self, step: int, *, last_step: bool = False) -> bool:
        """Whether ``maybe_save`` saves at ``step`` (1-based count of optimizer steps done)."""
        if not self.cfg.enable:
            return False
        if last_step or step % self.cfg.interval == 0:
            return True
        return step == 1 and bool(getattr(self.cfg, "enable_first_step_checkpoint", False))

    def maybe_save(self, step: int, *, last_step: bool = False) -> bool:
        """Save at ``step`` if the interval (or the last or first step) says so; True when it saved.

        Also publishes an asynchronous save that has finished since the last call (without waiting).
        The save at ``last_step`` is the weights-only export when ``last_save_model_only`` is set.
        """
        self._poll()
        if not self.should_save(step, last_step=last_step):
            return False
        self.save(step, model_only=last_step and self.cfg.last_save_model_only)
        return True

    # -- state ----------------------------------------------------------------------------------------
    def _model_state(self) -> dict[str, Any]:
        return {"model": get_model_state_dict(self.model)}

    def _full_state(self, step: int) -> dict[str, Any]:
        rank = f"rank{_rank()}"
        state = self._model_state()
        if self.optimizer is not None:
            state["optimizer"] = get_optimizer_state_dict(self.model, self.optimizer)
        if self.lr_scheduler is not None:
            state["lr_scheduler"] = json.dumps(self.lr_scheduler.state_dict())
        if self.dataloader is not None:
            state["dataloader"] = {rank: json.dumps(self.dataloader.state_dict())}
        state["rng"] = {rank: json.dumps(_rng_state())}
        if self.train_state is not None:
            state["train_state"] = {rank: json.dumps(self.train_state.state_dict())}
        state["step"] = json.dumps(step)
        return state

    def _export_state(self) -> dict[str, Any]:
        dtype = _DTYPES[self.cfg.export_dtype]
        model = self._model_state()["model"]
        return {
            "model": {
                k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v
                for k, v in model.items()
            }
        }

    # -- save -----------------------------------------------------------------------------------------
    def save(self, step: int, *, model_only: bool = False) -> Path:
        """Write the checkpoint of ``step``, published as ``folder/step-<step>``; returns that path.

        ``model_only`` writes the weights-only export (cast to ``export_dtype``), which is never resumed.
        With ``async_mode`` a full save returns once the state is staged; it is published when finished
        (call ``close()`` before exiting). Otherwise the checkpoint is published on every rank on return.
        Saving the step this manager has just saved the same way again (a SIGTERM right after an
        interval save) writes nothing.
        """
        final = self.folder / f"step-{step}"
        if self._saved == (step, model_only):
            return final
        self.wait()
        partial = self.folder / f".step-{step}.partial"
        state = self._export_state() if model_only else self._full_state(step)
        mode = getattr(self.cfg, "async_mode", "disabled")
        if mode != "disabled" and not model_only:
            future = dcp_async_save(
                state,
                checkpoint_id=str(partial),
                async_stager=self._pinned_stager(mode),
                **self._dcp_kwargs(),
            )
            self._in_flight = _InFlight(future, partial, final)
        else:
            with _single_process_ok():
                dcp_save(state, checkpoint_id=str(partial), **self._dcp_kwargs())
            self._publish(partial, final)
            self._barrier()
        self._saved = (step, model_only)
        return final

    def _pinned_stager(self, mode: str) -> Any:
        """A stager through pinned host memory for 'async_with_pinned_mem' on CUDA, else None (default)."""
        if mode != "async_with_pinned_mem" or not torch.cuda.is_available():
            return None
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=True,
                    use_shared_memory=False,
                    use_async_staging=False,
                    use_non_blocking_copy=False,
                )
            )
        return self._stager

    def _poll(self) -> None:
        """Publish the save in flight if it has finished; never blocks."""
        if self._in_flight is not None and self._in_flight.future.done():
            self._finish_in_flight()

    def _finish_in_flight(self) -> None:
        in_flight, self._in_flight = self._in_flight, None
        assert in_flight is not None
        in_flight.future.result()  # re-raises a failed write; the partial folder is then never published
        self._publish(in_flight.partial, in_flight.final)

    def wait(self) -> None:
        """Block until an asynchronous save in flight is written, and publish it (no-op otherwise)."""
        if self._in_flight is not None:
            self._finish_in_flight()

    def _publish(self, partial: Path, final: Path) -> None:
        """Rank 0 renames a finished save (every rank has written: ``.metadata`` exists) and prunes."""
        if _rank() != 0:
            return
        if self.run_config is not None:
            if self._run_config_yaml is None:
                from hyper_parallel.config import dump_config

                self._run_config_yaml = dump_config(self.run_config)
            (partial / CONFIG_FILE).write_text(self._run_config_yaml, encoding="utf-8")
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        keep = self.cfg.keep_latest_k
        if keep > 0:
            for old in complete_steps(self.folder)[:-keep]:
                shutil.rmtree(self.folder / f"step-{old}", ignore_errors=True)

    def close(self) -> None:
        """Finish and publish any save in flight (on every rank when this returns); free the stager."""
        self.wait()
        self._barrier()
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    # -- load -----------------------------------------------------------------------------------------
    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step in ``folder`` (full or export), or None."""
        steps = complete_steps(self.folder)
        return steps[-1] if steps else None

    def load(self) -> int:
        """Restore the training state at startup; returns the step to continue after (0: from scratch).

        With ``enable``, picks ``load_step`` or else the newest complete checkpoint in ``folder``:

        - a full checkpoint: restores every part not in ``exclude_from_loading``, returns its step;
        - a weights-only export at step N: returns N and loads nothing when the run is finished
          (``max_steps`` is None or <= N); when ``max_steps`` was raised past N, resumes the newest full
          checkpoint before N, or raises ``CheckpointNotResumableError`` if there is none (or if
          ``load_step`` names the export).

        With no checkpoint in ``folder`` (or without ``enable``), ``initial_load_path`` (if set) is loaded:
        the model alone with ``initial_load_model_only`` (returns 0), else the full state (returns its
        step). Raises ``FileNotFoundError`` when ``load_step`` or ``initial_load_path`` names no complete
        checkpoint.
        """
        self.wait()
        steps = complete_steps(self.folder) if self.cfg.enable else []
        if self.cfg.enable and self.cfg.load_step >= 0:
            if self.cfg.load_step not in steps:
                raise FileNotFoundError(
                    f"checkpoint.load_step: no complete checkpoint for step {self.cfg.load_step} in "
                    f"{str(self.folder)!r} (complete: {steps})"
                )
            return self._resume(self.cfg.load_step, steps, explicit=True)
        if steps:
            return self._resume(steps[-1], steps, explicit=False)
        if self.cfg.initial_load_path is None:
            return 0
        return self._load_initial(Path(self.cfg.initial_load_path))

    def _resume(self, step: int, steps: list[int], *, explicit: bool) -> int:
        path = self.folder / f"step-{step}"
        keys = _saved_keys(path)
        if _is_full(keys):
            return self._load_full(path, keys)
        if self.max_steps is None or step >= self.max_steps:
            return step  # the run finished with this export
        if not explicit:
            for earlier in reversed([s for s in steps if s < step]):
                earlier_path = self.folder / f"step-{earlier}"
                earlier_keys = _saved_keys(earlier_path)
                if _is_full(earlier_keys):
                    _log.warning(
                        "step %d in %s is a weights-only export and training.max_steps is now %d: "
                        "resuming from the full checkpoint of step %d",
                        step,
                        self.folder,
                        self.max_steps,
                        earlier,
                    )
                    return self._load_full(earlier_path, earlier_keys)
        raise CheckpointNotResumableError(
            f"checkpoint.folder {str(self.folder)!r}: step {step} is a weights-only export (the final save "
            f"with checkpoint.last_save_model_only: true) and training.max_steps is now {self.max_steps}; "
            "it holds no optimizer, scheduler or data state, so training cannot resume from it"
            + ("" if explicit else " and no earlier full checkpoint remains")
            + ". Set checkpoint.load_step to a full checkpoint, or start a new run from these weights with "
            f"checkpoint.initial_load_path: {str(path)!r} and another checkpoint.folder; set "
            "checkpoint.last_save_model_only: false to keep final checkpoints resumable."
        )

    def _load_initial(self, path: Path) -> int:
        if not (path / ".metadata").is_file():
            raise FileNotFoundError(
                f"checkpoint.initial_load_path {str(path)!r} is not a complete DCP checkpoint"
            )
        keys = _saved_keys(path)
        if self.cfg.initial_load_model_only:
            self._load_model(path, keys)
            return 0
        if not _is_full(keys):
            raise CheckpointNotResumableError(
                f"checkpoint.initial_load_path {str(path)!r} is a weights-only export: it holds no "
                "optimizer, scheduler or data state; set checkpoint.initial_load_model_only: true"
            )
        return self._load_full(path, keys)

    def _load_model(self, path: Path, keys: set[str]) -> None:
        if not any(key.startswith("model.") for key in keys):
            raise ValueError(f"checkpoint {str(path)!r} holds no model state")
        state = self._model_state()
        with _single_process_ok():
            dcp_load(state, checkpoint_id=str(path), **self._dcp_kwargs())
        set_model_state_dict(self.model, state["model"], options=StateDictOptions(strict=True))

    def _wanted(self, path: Path, keys: set[str]) -> dict[str, Any]:
        """Placeholders of the parts to restore from a full checkpoint; refuses missing ones.

        A per-rank part is read from this rank's entry, or from rank 0's when the checkpoint was saved by
        fewer processes (a resume on another layout): every rank is at the same step and data position
        then, and the trainer seeds every rank alike.
        """
        owners: dict[str, Any] = {
            "optimizer": self.optimizer,
            "lr_scheduler": self.lr_scheduler,
            "dataloader": self.dataloader,
            "rng": True,
            "train_state": self.train_state,
        }
        wanted: dict[str, Any] = {}
        for part, owner in owners.items():
            if owner is None or part in self.cfg.exclude_from_loading:
                continue
            if part in _PER_RANK:
                entry = _saved_rank(part, keys)
                present = entry is not None
                wanted_value: Any = {entry: ""}
            elif part == "optimizer":
                present = any(key.startswith("optimizer.") for key in keys)
                wanted_value = None
            else:
                present = part in keys
                wanted_value = ""
            if not present:
                raise ValueError(
                    f"checkpoint {str(path)!r} holds no {part!r} state; add {part!r} to "
                    "checkpoint.exclude_from_loading to start it fresh"
                )
            wanted[part] = wanted_value
        return wanted

    def _load_full(self, path: Path, keys: set[str]) -> int:
        wanted = self._wanted(path, keys)
        state = self._model_state()
        if "optimizer" in wanted:
            state["optimizer"] = get_optimizer_state_dict(self.model, self.optimizer)  # type: ignore[arg-type]
        state.update({part: value for part, value in wanted.items() if part != "optimizer"})
        state["step"] = ""
        with _single_process_ok():
            dcp_load(state, checkpoint_id=str(path), **self._dcp_kwargs())
        set_model_state_dict(self.model, state["model"], options=StateDictOptions(strict=True))
        if "optimizer" in state:
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])  # type: ignore[arg-type]
        if self.lr_scheduler is not None:
            if "lr_scheduler" in state:
                self.lr_scheduler.load_state_dict(json.loads(state["lr_scheduler"]))
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
        return int(json.loads(state["step"]))
