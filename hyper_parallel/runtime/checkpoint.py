"""Runtime of ``hyper_parallel.components.checkpoint``: a checkpoint manager over torch DCP.

Imported only from ``Checkpoint.Config.build``; this module imports torch.

Layout: ``folder/step-<N>/`` holds one DCP checkpoint. A save writes into ``folder/.step-<N>.partial``
and, once every rank has written (DCP's ``.metadata`` file closes the write), rank 0 renames it to
``step-<N>``: a crash mid-save leaves only a ``.partial`` folder, which is never loaded and is
removed by the next save. Only ``step-<N>`` folders holding ``.metadata`` count as complete.

Saved state: ``model`` and ``optimizer`` (tensors, through ``torch.distributed.checkpoint.state_dict``
so sharded models work), ``lr_scheduler`` and ``dataloader`` (JSON text; the dataloader's per rank, under
``dataloader.rank<r>``) and ``train_state`` (``{"step": N}``). DCP works without a process group for a
single process; with one, every rank calls ``save`` / ``load``.

With ``async_mode`` the state is staged in host memory and written by a background thread; the
checkpoint is published when the next save, ``load``, ``wait`` or ``close`` finds it finished, so an
interrupted asynchronous write is never loaded either.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from hyper_parallel.components.checkpoint import DCPCheckpoint

__all__ = ["CheckpointManager", "complete_steps"]

_STEP_DIR = re.compile(r"step-(\d+)")
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


_SINGLE_PROCESS = (
    r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent is to "
    r"(save|load) in a single process"
)
# Without a process group DCP runs as a single process, which is the intent, yet it warns on every save
# and load. Synchronous calls silence it locally (_single_process_ok); the background thread of an
# asynchronous save is out of reach of catch_warnings, hence this narrow process-wide filter.
warnings.filterwarnings("ignore", message=_SINGLE_PROCESS, category=UserWarning)


@contextlib.contextmanager
def _single_process_ok() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SINGLE_PROCESS, category=UserWarning)
        yield


def _no_dist() -> bool:
    """Whether DCP runs as a single process (no process group)."""
    return not (dist.is_available() and dist.is_initialized())


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


class CheckpointManager:
    """Saves and restores training state; see the module docstring for the layout and guarantees."""

    def __init__(
        self,
        cfg: DCPCheckpoint.Config | Any,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        dataloader: Any = None,
    ) -> None:
        self.cfg = cfg
        self.folder = Path(cfg.folder)
        self.model, self.optimizer = model, optimizer
        self.lr_scheduler, self.dataloader = lr_scheduler, dataloader
        self._pending: Any = None  # future of an asynchronous save, and the paths to publish after it
        self._pending_paths: tuple[Path, Path] | None = None
        self._stager: Any = None

    # -- when -----------------------------------------------------------------------------------------
    def should_save(self, step: int, *, last_step: bool = False) -> bool:
        """Whether ``maybe_save`` saves at ``step`` (1-based count of optimizer steps done)."""
        if not self.cfg.enable:
            return False
        if last_step or step % self.cfg.interval == 0:
            return True
        return step == 1 and bool(getattr(self.cfg, "enable_first_step_checkpoint", False))

    def maybe_save(self, step: int, *, last_step: bool = False) -> bool:
        """Save at ``step`` if the interval (or the last or first step) says so; True when it saved."""
        if not self.should_save(step, last_step=last_step):
            return False
        self.save(step, model_only=last_step and self.cfg.last_save_model_only)
        return True

    # -- state ----------------------------------------------------------------------------------------
    def _state(self, *, model_only: bool = False, parts: tuple[str, ...] | None = None) -> dict[str, Any]:
        want = set(parts) if parts is not None else {"model", "optimizer", "lr_scheduler", "dataloader"}
        state: dict[str, Any] = {}
        if "model" in want:
            state["model"] = get_model_state_dict(self.model)
        if model_only:
            return state
        if self.optimizer is not None and "optimizer" in want:
            state["optimizer"] = get_optimizer_state_dict(self.model, self.optimizer)
        if self.lr_scheduler is not None and "lr_scheduler" in want:
            state["lr_scheduler"] = json.dumps(self.lr_scheduler.state_dict())
        if self.dataloader is not None and "dataloader" in want:
            state["dataloader"] = {f"rank{_rank()}": json.dumps(self.dataloader.state_dict())}
        if "train_state" in want or parts is None:
            state["train_state"] = json.dumps({"step": 0})
        return state

    # -- save -----------------------------------------------------------------------------------------
    def save(self, step: int, *, model_only: bool = False) -> Path:
        """Write the checkpoint of ``step`` and publish it as ``folder/step-<step>``; returns that path.

        ``model_only`` saves the model weights alone, cast to ``export_dtype`` (the final export).
        """
        self.wait()
        final = self.folder / f"step-{step}"
        partial = self.folder / f".step-{step}.partial"
        if _rank() == 0:
            self.folder.mkdir(parents=True, exist_ok=True)
            for stale in self.folder.glob(".step-*.partial"):
                shutil.rmtree(stale, ignore_errors=True)
        _barrier()
        state = self._state(model_only=model_only)
        if model_only:
            dtype = _DTYPES[self.cfg.export_dtype]
            state["model"] = {
                k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v
                for k, v in state["model"].items()
            }
        else:
            state["train_state"] = json.dumps({"step": step})
        mode = getattr(self.cfg, "async_mode", "disabled")
        if mode != "disabled" and not model_only:
            # The state is staged (copied) before async_save returns: training may go on at once.
            self._pending = dcp_async_save(
                state,
                checkpoint_id=str(partial),
                async_stager=self._pinned_stager(mode),
                no_dist=_no_dist(),
            )
            self._pending_paths = (partial, final)
            return final
        with _single_process_ok():
            dcp_save(state, checkpoint_id=str(partial), no_dist=_no_dist())
        self._publish(partial, final)
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

    def wait(self) -> None:
        """Finish and publish an asynchronous save still in flight (no-op otherwise)."""
        if self._pending is None or self._pending_paths is None:
            return
        pending = self._pending
        upload = getattr(pending, "upload_completion", None)  # AsyncSaveResponse of a staged save
        (upload if upload is not None else pending).result()
        partial, final = self._pending_paths
        self._pending, self._pending_paths = None, None
        self._publish(partial, final)

    def _publish(self, partial: Path, final: Path) -> None:
        _barrier()
        if _rank() == 0:
            if final.exists():
                shutil.rmtree(final)
            os.replace(partial, final)
            self._prune()
        _barrier()

    def _prune(self) -> None:
        keep = self.cfg.keep_latest_k
        if keep <= 0:
            return
        for old in complete_steps(self.folder)[:-keep]:
            shutil.rmtree(self.folder / f"step-{old}", ignore_errors=True)

    def close(self) -> None:
        """Wait for (and publish) any save in flight; release the pinned-memory stager."""
        self.wait()
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    # -- load -----------------------------------------------------------------------------------------
    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step in ``folder``, or None."""
        steps = complete_steps(self.folder)
        return steps[-1] if steps else None

    def load(self, step: int | None = None) -> int:
        """Restore the checkpoint of ``step`` (default: ``load_step``, -1 meaning the newest).

        Returns the restored step; 0 when nothing was loaded. A model-only checkpoint (the final export)
        restores the model alone and returns the step in its folder name. When ``folder`` holds no
        checkpoint and
        ``initial_load_path`` is set, that checkpoint is loaded (model only if
        ``initial_load_model_only``) and 0 is returned: training starts at step 0 from those weights.
        Parts listed in ``exclude_from_loading`` keep their current state.
        """
        self.wait()
        if step is None and self.cfg.load_step >= 0:
            step = self.cfg.load_step
        if step is None:
            step = self.latest_step()
        if step is not None:
            path = self.folder / f"step-{step}"
            if not (path / ".metadata").is_file():
                raise FileNotFoundError(f"no complete checkpoint for step {step} in {str(self.folder)!r}")
            return self._load_from(path, model_only=False, step=step)
        if self.cfg.initial_load_path is None:
            return 0
        path = Path(self.cfg.initial_load_path)
        if not (path / ".metadata").is_file():
            raise FileNotFoundError(f"initial_load_path {str(path)!r} is not a complete DCP checkpoint")
        self._load_from(path, model_only=self.cfg.initial_load_model_only, step=0)
        return 0

    def _load_from(self, path: Path, *, model_only: bool, step: int) -> int:
        excluded = set(self.cfg.exclude_from_loading)
        reader = FileSystemReader(str(path))
        saved = set(reader.read_metadata().state_dict_metadata)
        parts = tuple(
            part
            for part in ("model", "optimizer", "lr_scheduler", "dataloader", "train_state")
            if part not in excluded and not (model_only and part != "model")
        )
        state = self._state(parts=parts)
        present = {key.split(".", 1)[0] for key in saved}
        state = {k: v for k, v in state.items() if k in present}
        if "dataloader" in state and f"dataloader.rank{_rank()}" not in saved:
            raise ValueError(f"checkpoint {str(path)!r} has no data position for rank {_rank()}")
        if "model" not in state:
            raise ValueError(f"checkpoint {str(path)!r} holds no model state")
        with _single_process_ok():
            dcp_load(state, checkpoint_id=str(path), no_dist=_no_dist())
        set_model_state_dict(self.model, state["model"], options=StateDictOptions(strict=True))
        if "optimizer" in state and self.optimizer is not None:
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        if "lr_scheduler" in state and self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(json.loads(state["lr_scheduler"]))
        if "dataloader" in state and self.dataloader is not None:
            self.dataloader.load_state_dict(json.loads(state["dataloader"][f"rank{_rank()}"]))
        if "train_state" in state:
            return int(json.loads(state["train_state"])["step"])
        return step
