"""The checkpoint manager over torch DCP: when to save, the save and load protocol (part of ``Checkpoint``).

Built by ``DCPCheckpoint.Config.build``; this module imports torch. The folder layout and its publish
protocol are in ``_layout``, what a checkpoint holds (full or weights-only export, resharding) in ``_state``.

``load()`` resumes from full checkpoints only. When the checkpoint it picks (the newest, or ``load_step``)
is an export at step ``N``: with ``N >= max_steps`` (or ``max_steps`` unknown) the run is finished and
``N`` is returned with nothing loaded; when ``max_steps`` was raised past ``N``, the newest full
checkpoint before ``N`` is resumed (a warning says so), and with none left (or ``load_step`` naming the
export) ``CheckpointNotResumableError`` says what to change.

Integrity: before loading a checkpoint every rank inspects it (``_safe_read.inspect``: its files against
the checksum manifest, ``.metadata`` through the restricted unpickler, every byte range inside a file;
rank 0 computes the digests, the other ranks check sizes) and the ranks agree on the result on the
manager's group. A checkpoint that fails is skipped with a warning naming the file and the step, and the
newest intact one is resumed; with none intact ``load()`` raises ``CheckpointNotResumableError`` naming
each step's problem (the trainer exits 1 with it). A ``load_step`` or ``initial_load_path`` that fails
raises it at once. A checkpoint saved before manifests existed is loaded with a warning that its contents
are not verified. Everything is read through ``SafeReader`` and ``SafePlanner``: nothing in the folder is
unpickled but DCP's metadata classes and tensors.

Process groups: with torch.distributed initialised the manager creates one gloo group of all ranks and
runs every DCP collective and barrier on it, never on the default group. An ``async`` save stages the state
in host memory (training goes on at once) and writes it from a background thread whose collectives stay on
that group, so they cannot interleave with FSDP's collectives on the default group. Its completion on rank
0 means every rank has written and ``.metadata`` exists, so rank 0 publishes it (rename and prune, file
operations only) as soon as it sees it done: polled after each step by ``maybe_save``, and waited for by
the next save, ``load``, ``wait`` and ``close``; no collective runs from the training thread while a save
is in flight. ``async_with_pinned_mem`` stages through pinned host memory on CUDA and is plain ``async`` on
a CPU-only machine (there is no device-to-host copy to speed up).

The group is bounded like every other (``comm.init_timeout_seconds``, then ``comm.train_timeout_seconds``
from the first step: see ``parallel.process_group``), and ``close(abandon=True)``, the error path, runs no
collective and waits for no save.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from hyper_parallel._checks import counted
from hyper_parallel._disk import full_disk_errno, write_problem
from hyper_parallel.components.checkpoint import CheckpointNotResumableError
from hyper_parallel.components.checkpoint._base_record import BASE_FILE, changes, read_record, record_text
from hyper_parallel.components.checkpoint._layout import (
    CONFIG_FILE,
    CheckpointFolderError,
    FolderLock,
    complete_steps,
    discard_partial,
    lock_folder,
    make_partial,
    partial_folder,
    publish,
    remove_incomplete,
    step_folder,
)
from hyper_parallel.components.checkpoint._safe_read import (
    Inspection,
    SafePlanner,
    SafeReader,
    UnreadableCheckpointError,
    inspect,
    unreadable,
)
from hyper_parallel.components.checkpoint._state import (
    Stateful,
    TrainingState,
    is_full,
    model_shape_differences,
)
from hyper_parallel.errors import InputFileError
from hyper_parallel.parallel.process_group import new_group, peer_failure

if TYPE_CHECKING:
    from hyper_parallel.components.checkpoint import DCPCheckpoint

__all__ = ["CheckpointManager"]

_log = logging.getLogger(__name__)

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


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


class _InFlight:
    """An asynchronous save: its future and where it is published once finished."""

    def __init__(self, future: Any, partial: Path, final: Path) -> None:
        # A staged save returns an AsyncSaveResponse whose upload_completion is the write.
        self.future: Future[Any] = getattr(future, "upload_completion", future)
        self.partial, self.final = partial, final


class CheckpointManager:
    """Saves and restores training state; see the module docstrings for the layout and guarantees.

    The trainer calls ``load()`` once after building everything, ``maybe_save(step, last_step=...)``
    after every optimizer step, ``save(step)`` to save outside the interval (for example on SIGTERM),
    and ``close()`` before exiting (it finishes and publishes a save still in flight). ``run_config_yaml``
    (the run's config as YAML, which the trainer dumps) is written into every published checkpoint.
    With ``enable``, rank 0 locks the folder from construction to ``close()`` (``_layout.lock_folder``): a
    folder another process holds, or a symbolic link among its entries, raises ``CheckpointFolderError``
    on every rank.
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
        run_config_yaml: str | None = None,
        save_frozen: bool = True,
        base_record: dict[str, Any] | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_config_yaml = run_config_yaml
        self.base_record = base_record
        self.folder = Path(cfg.folder)
        self.state = TrainingState(
            model=model,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            dataloader=dataloader,
            train_state=train_state,
            rank=_rank(),
            save_frozen=save_frozen,
        )
        self.max_steps = max_steps
        self._in_flight: _InFlight | None = None
        #: What ``load()`` read, in words (the launch prints it), or None when it read nothing.
        self.loaded: str | None = None
        self._saved: tuple[int, bool] | None = None  # (step, model_only) of this manager's newest save
        self._stager: Any = None
        # Every rank builds the manager with the same config, so every rank creates the group (a
        # collective) or none does.
        uses_files = cfg.enable or cfg.initial_load_path is not None
        self._group: Any = new_group(backend="gloo") if uses_files and _distributed() else None
        self._lock: FolderLock | None = None
        if cfg.enable:
            self._on_rank0(self._start)

    def _start(self) -> None:
        """Rank 0: lock the folder for this run, then remove what a killed save left."""
        self._lock = lock_folder(self.folder)
        remove_incomplete(self.folder)

    # -- helpers --------------------------------------------------------------------------------------
    def _barrier(self) -> None:
        if self._group is not None:
            dist.barrier(group=self._group)

    def _on_rank0(self, work: Callable[[], object]) -> None:
        """Run ``work()`` on rank 0; every rank returns after it, or raises its ``CheckpointFolderError``."""
        problem: CheckpointFolderError | None = None
        if _rank() == 0:
            try:
                work()
            except CheckpointFolderError as exc:
                if self._group is None:
                    raise
                problem = exc
        if self._group is not None:  # also the barrier: the others wait for rank 0's outcome
            shared: list[CheckpointFolderError | None] = [problem]
            dist.broadcast_object_list(shared, src=0, group=self._group)
            if shared[0] is not None:
                raise shared[0]

    def _dcp_kwargs(self) -> dict[str, Any]:
        if self._group is None:
            return {"no_dist": True}
        return {"process_group": self._group}

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

    # -- save -----------------------------------------------------------------------------------------
    def save(self, step: int, *, model_only: bool = False) -> Path:
        """Write the checkpoint of ``step``, published as ``folder/step-<step>``; returns that path.

        ``model_only`` writes the weights-only export (cast to ``export_dtype``), which is never resumed.
        With ``async_mode`` a full save returns once the state is staged; it is published when finished
        (call ``close()`` before exiting). Otherwise the checkpoint is published on every rank on return.
        Saving the step this manager has just saved the same way again (a SIGTERM right after an
        interval save) writes nothing.
        """
        final = step_folder(self.folder, step)
        if self._saved == (step, model_only):
            return final
        self.wait()
        partial = partial_folder(self.folder, step)
        self._on_rank0(lambda: make_partial(self.folder, step))  # created exclusively, before any rank writes
        state = self.state.export(self.cfg.export_dtype) if model_only else self.state.full(step)
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
            try:
                with _single_process_ok():
                    dcp_save(state, checkpoint_id=str(partial), **self._dcp_kwargs())
            except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
                self._refuse_disk_full(exc, partial, step)
                raise
            self._on_rank0(lambda: self._publish(partial, final))
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
        try:
            in_flight.future.result()  # re-raises a failed write; the partial folder is then never published
        except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
            self._refuse_disk_full(exc, in_flight.partial, _step_of(in_flight.final))
            raise
        self._publish(in_flight.partial, in_flight.final)

    def wait(self) -> None:
        """Block until an asynchronous save in flight is written, and publish it (no-op otherwise)."""
        if self._in_flight is not None:
            self._finish_in_flight()

    def _publish(self, partial: Path, final: Path) -> None:
        """Rank 0 publishes a finished save (every rank has written: ``.metadata`` exists) and prunes."""
        if _rank() == 0:
            try:
                extra = {} if self.base_record is None else {BASE_FILE: record_text(self.base_record)}
                publish(
                    partial,
                    final,
                    keep_latest_k=self.cfg.keep_latest_k,
                    config_yaml=self.run_config_yaml,
                    extra=extra,
                )
            except OSError as exc:
                self._refuse_disk_full(exc, partial, _step_of(final))
                raise

    def _refuse_disk_full(self, exc: BaseException, partial: Path, step: int) -> None:
        """When ``exc`` is a full disk: remove the save's partial folder (rank 0) and raise an
        ``InputFileError`` naming ENOSPC and the folder; the previous checkpoints stay as they were.

        Nothing here waits on another rank (the error path): each rank whose write failed raises.
        """
        code = _disk_full(exc)
        if code is None:
            return
        if _rank() == 0:
            discard_partial(partial)
        steps = complete_steps(self.folder)
        kept = (
            f"the newest complete checkpoint, step {steps[-1]}, is kept" if steps else "no checkpoint is kept"
        )
        raise InputFileError.at(
            self.folder,
            f"{_FULL_DISK_PHRASES.get(code) or write_problem(OSError(code, os.strerror(code)))} while "
            f"saving step {step}: its partial folder was "
            f"removed and {kept}; free space, lower checkpoint.keep_latest_k or move checkpoint.folder, then "
            "relaunch to resume",
        ) from None

    def close(self, *, abandon: bool = False) -> None:
        """Finish and publish any save in flight (on every rank when this returns); free the stager.

        ``abandon`` is the error path (another rank may have stopped): no barrier and no wait for a save
        in flight, which is never published (its partial folder is removed at the next start, the newest
        published checkpoint stays the one to resume). Its background write ends within the group's
        timeout at the latest.
        """
        if abandon:
            self._in_flight = None
        else:
            self.wait()
            self._barrier()
            if self._stager is not None:
                self._stager.close()
                self._stager = None
        if self._lock is not None:  # the folder is free for the next run, on the error path too
            self._lock.release()
            self._lock = None

    # -- load -----------------------------------------------------------------------------------------
    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step in ``folder`` (full or export), or None."""
        steps = complete_steps(self.folder)
        return steps[-1] if steps else None

    def load(self) -> int:
        """Restore the training state at startup; returns the step to continue after (0: from scratch).

        With ``enable``, picks ``load_step`` or else the newest complete and intact checkpoint in
        ``folder`` (one that fails its inspection is skipped with a warning naming the file):

        - a full checkpoint: restores every part not in ``exclude_from_loading``, returns its step;
        - a weights-only export at step N: returns N and loads nothing when the run is finished
          (``max_steps`` is None or <= N); when ``max_steps`` was raised past N, resumes the newest full
          intact checkpoint before N, or raises ``CheckpointNotResumableError`` if there is none (or if
          ``load_step`` names the export).

        With no checkpoint in ``folder`` (or without ``enable``), ``initial_load_path`` (if set) is loaded:
        the model alone with ``initial_load_model_only`` (returns 0), else the full state (returns its
        step). Raises ``FileNotFoundError`` when ``load_step`` or ``initial_load_path`` names no complete
        checkpoint, and ``CheckpointNotResumableError`` when every complete checkpoint in ``folder``, the
        ``load_step`` one or ``initial_load_path`` fails its inspection or holds content that is refused.
        """
        self.wait()
        steps = complete_steps(self.folder) if self.cfg.enable else []
        if self.cfg.enable and self.cfg.load_step >= 0:
            if self.cfg.load_step not in steps:
                raise FileNotFoundError(
                    f"checkpoint.load_step: no complete checkpoint for step {self.cfg.load_step} in "
                    f"{str(self.folder)!r} (complete: {steps})"
                )
            path = step_folder(self.folder, self.cfg.load_step)
            inspection, problem = self._inspect(path)
            if inspection is None:
                raise CheckpointNotResumableError(
                    f"checkpoint.load_step {self.cfg.load_step}: the checkpoint is damaged: {problem}"
                )
            try:
                return self._resume(self.cfg.load_step, inspection, steps, explicit=True)
            except UnreadableCheckpointError as exc:
                raise CheckpointNotResumableError(
                    f"checkpoint.load_step {self.cfg.load_step}: the checkpoint is damaged: {exc}"
                ) from None
        if steps:
            problems: list[str] = []
            for step in reversed(steps):
                inspection = self._intact(step, problems)
                if inspection is None:
                    continue
                try:
                    return self._resume(step, inspection, steps, explicit=False)
                except UnreadableCheckpointError as exc:  # failed when read: as if it failed inspection
                    _log.warning("skipping the checkpoint of step %d: %s", step, exc)
                    problems.append(f"step {step}: {exc}")
            raise CheckpointNotResumableError(
                f"checkpoint.folder {str(self.folder)!r}: no intact checkpoint to resume ("
                + "; ".join(problems)
                + "); move the damaged step folders away to start from scratch or from "
                "checkpoint.initial_load_path"
            )
        if self.cfg.initial_load_path is None:
            return 0
        path = Path(self.cfg.initial_load_path)
        try:
            return self._load_initial(path)
        except UnreadableCheckpointError as exc:
            raise CheckpointNotResumableError(
                f"checkpoint.initial_load_path {str(path)!r} is damaged: {exc}"
            ) from None

    def load_model_from(self, path: Path) -> None:
        """Read the model weights of the checkpoint ``path`` into the model (``evaluate``'s weights).

        Call it on every rank. Inspected first, as ``load()`` inspects (rank 0 hashes, every rank agrees);
        raises ``UnreadableCheckpointError`` naming the file when the inspection fails on any rank or a
        part fails to read, so that ``_newest.newest_readable`` tries an older step on every rank alike,
        and ``InputFileError`` when ``path`` holds another model's shapes.
        """
        inspection, problem = self._inspect(path)
        if inspection is None:
            raise UnreadableCheckpointError(problem)
        self._load_model(path, inspection)

    def _inspect(self, path: Path) -> tuple[Inspection | None, str]:
        """``inspect`` on every rank (rank 0 hashes): the inspection if all passed, else the problem."""
        try:
            inspection: Inspection | None = inspect(path, digests=_rank() == 0)
            problem = ""
        except (UnreadableCheckpointError, OSError) as exc:
            inspection, problem = None, str(exc)
        if self._group is not None:
            passed = torch.tensor([0 if inspection is None else 1], dtype=torch.int64)
            dist.all_reduce(passed, op=dist.ReduceOp.MIN, group=self._group)
            if inspection is not None and not int(passed.item()):
                inspection, problem = None, f"{path}: failed its inspection on another rank"
        if inspection is not None and not inspection.verified:
            _log.warning(
                "checkpoint %s holds no checksums.json (saved by an older version): loading it without "
                "verifying its contents",
                path,
            )
        return inspection, problem

    def _intact(self, step: int, problems: list[str]) -> Inspection | None:
        """The inspection of ``step`` in ``folder`` if intact; else None, a warning and ``problems`` noted."""
        inspection, problem = self._inspect(step_folder(self.folder, step))
        if inspection is None:
            _log.warning("skipping the checkpoint of step %d: %s", step, problem)
            problems.append(f"step {step}: {problem}")
        return inspection

    def _resume(self, step: int, inspection: Inspection, steps: list[int], *, explicit: bool) -> int:
        path = step_folder(self.folder, step)
        if is_full(set(inspection.metadata.state_dict_metadata)):
            return self._load_full(path, inspection)
        if self.max_steps is None or step >= self.max_steps:
            return step  # the run finished with this export
        if not explicit:
            problems: list[str] = []
            for earlier in reversed([s for s in steps if s < step]):
                earlier_inspection = self._intact(earlier, problems)
                if earlier_inspection is not None and is_full(
                    set(earlier_inspection.metadata.state_dict_metadata)
                ):
                    _log.warning(
                        "step %d in %s is a weights-only export and training.max_steps is now %d: "
                        "resuming from the full checkpoint of step %d",
                        step,
                        self.folder,
                        self.max_steps,
                        earlier,
                    )
                    return self._load_full(step_folder(self.folder, earlier), earlier_inspection)
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
        inspection, problem = self._inspect(path)
        if inspection is None:
            raise CheckpointNotResumableError(
                f"checkpoint.initial_load_path {str(path)!r} is damaged: {problem}"
            )
        keys = set(inspection.metadata.state_dict_metadata)
        tensors = sum(1 for key in keys if key.startswith("model."))
        if self.cfg.initial_load_model_only:
            self._load_model(path, inspection)
            self.loaded = (
                f"warm start from {path}: {counted(tensors, 'model tensor')} (weights only; "
                "optimizer, schedule and data start fresh at step 0)"
            )
            return 0
        if not is_full(keys):
            raise CheckpointNotResumableError(
                f"checkpoint.initial_load_path {str(path)!r} is a weights-only export: it holds no "
                "optimizer, scheduler or data state; set checkpoint.initial_load_model_only: true"
            )
        step = self._load_full(path, inspection)
        self.loaded = (
            f"warm start from {path}: the full state of step {step} ({counted(tensors, 'model tensor')}, "
            "optimizer, schedule, data position)"
        )
        return step

    def _read(self, state: dict[str, Any], path: Path) -> None:
        """``dcp.load`` of ``state`` from ``path`` through the safe reader and planner.

        Raises ``UnreadableCheckpointError`` naming the file when a part fails to read (a refused item, a
        chunk that is no saved tensor): ``load`` skips an automatically chosen step for an older one then,
        and every rank sees the failure (DCP gathers them), so every rank falls back alike. The state
        read so far is overwritten by the older step's, whose every part is read again.
        """
        reader = SafeReader(str(path))
        try:
            with _single_process_ok():
                dcp_load(
                    state,
                    checkpoint_id=str(path),
                    storage_reader=reader,
                    planner=SafePlanner(reader),
                    **self._dcp_kwargs(),
                )
        except CheckpointException as exc:
            for failure, _trace in exc.failures.values():
                if isinstance(failure, UnreadableCheckpointError):
                    raise UnreadableCheckpointError(str(failure)) from None
            if any(peer_failure(failure) is not None for failure, _trace in exc.failures.values()):
                raise  # another rank stopped: not this step's fault, and no older step would read better
            raise unreadable(path, exc) from None

    def _check_base(self, path: Path) -> None:
        """Refuse a checkpoint without its frozen base whose ``base.json`` names another base than the one
        this run built (``_base_record``), unless ``accept_changed_base``; an ``InputFileError`` naming the
        record, the folder and what changed (exit status 2)."""
        if self.state.save_frozen or self.base_record is None:
            return
        saved = read_record(path)
        if saved is None:
            return
        found = changes(saved, self.base_record)
        if not found:
            return
        where = self.base_record.get("weights_path")
        base = f"model.weights_path {where!r}" if where is not None else "the base drawn from the seed"
        if getattr(self.cfg, "accept_changed_base", False):
            _log.warning("%s: %s differs (%s): accepted", path / BASE_FILE, base, "; ".join(found))
            return
        raise InputFileError.at(
            path / BASE_FILE,
            f"{base} is not the frozen base this checkpoint's adapters were trained on ({'; '.join(found)}); "
            "set checkpoint.accept_changed_base: true to load them on it anyway",
        )

    def _load_model(self, path: Path, inspection: Inspection) -> None:
        self._check_base(path)
        items = inspection.metadata.state_dict_metadata
        if not any(key.startswith("model.") for key in items):
            raise ValueError(f"checkpoint {str(path)!r} holds no model state")
        state = self.state.model_state()
        _refuse_another_shape(
            path, state["model"], items, "checkpoint.initial_load_path", self.state.frozen_names()
        )
        self._read(state, path)
        self.state.restore_model(state)

    def _load_full(self, path: Path, inspection: Inspection) -> int:
        self._check_base(path)
        items = inspection.metadata.state_dict_metadata
        state = self.state.placeholders(self.state.wanted(path, items, self.cfg.exclude_from_loading), items)
        field = "checkpoint.folder" if path.parent == self.folder else "checkpoint.initial_load_path"
        _refuse_another_shape(path, state["model"], items, field, self.state.frozen_names())
        self._read(state, path)
        return self.state.restore(path, state)


def _step_of(final: Path) -> int:
    """N of a ``step-N`` folder."""
    return int(final.name.rpartition("-")[2])


#: ENOSPC as the save's refusal has always said it; the other full-disk errnos as ``write_problem`` does.
_FULL_DISK_PHRASES = {errno.ENOSPC: "no space left on the device (ENOSPC)"}


def _disk_full(exc: BaseException) -> int | None:
    """The full-disk errno (ENOSPC, EDQUOT, EFBIG: ``FULL_DISK_ERRNOS``) of ``exc`` or of a failure it
    carries (a cause, DCP's per-rank failures), or None.

    torch's writers do not always keep the ``OSError``: the zip writer's "enforce fail" names it in text.
    """
    pending, seen = [exc], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, CheckpointException):
            pending.extend(failure for failure, _trace in current.failures.values())
        elif (code := full_disk_errno(current)) is not None:
            return code
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return None


def _refuse_another_shape(
    path: Path, model: dict[str, Any], items: Any, field: str, unread: AbstractSet[str] = frozenset()
) -> None:
    """An ``InputFileError`` naming the tensors when the checkpoint at ``path`` holds another model.

    Checked before DCP reads anything (its own "Missing key" or size-mismatch errors name no remedy);
    every rank sees the same metadata, so every rank refuses it.
    """
    differences = model_shape_differences(model, items, unread)
    if differences:
        raise InputFileError.at(
            path,
            f"saved with another model shape: {'; '.join(differences)}; resume with the model arguments it "
            f"was saved with (its {CONFIG_FILE}), or use another {field}",
        )
