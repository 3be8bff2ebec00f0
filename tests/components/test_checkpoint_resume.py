"""The checkpoint manager resumes exactly: K steps, save, a fresh process state, load, N more steps.

A run here is what the trainer builds from configs: a tiny model with dropout (torch RNG), a loss scaled by
Python ``random`` draws (Python RNG), AdamW, the real WarmupDecay scheduler, the real text data loader and
a trainer-provided ``train_state``. Single process on CPU in fp32: the resumed losses equal the straight
run's bitwise.
"""

import random
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from hyper_parallel.components.checkpoint import (  # noqa: E402
    CheckpointNotResumableError,
    DCPCheckpoint,
)
from hyper_parallel.components.checkpoint._layout import complete_steps  # noqa: E402
from hyper_parallel.components.dataloader import JsonlSource, LoaderRequest, TextDataLoader  # noqa: E402
from hyper_parallel.components.loss import CausalLMLoss  # noqa: E402
from hyper_parallel.components.lr_scheduler import WarmupDecay  # noqa: E402
from hyper_parallel.components.optimizer import AdamW  # noqa: E402
from hyper_parallel.components.tokenizer import HuggingFaceTokenizer  # noqa: E402
from tests.support.components import DropoutLM, train_tokenizer, write_jsonl  # noqa: E402


class Tally:
    """A trainer-side stateful: tokens seen and the losses so far."""

    def __init__(self) -> None:
        self.tokens, self.losses = 0, []  # type: tuple[int, list[float]]

    def state_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "losses": list(self.losses)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tokens, self.losses = state["tokens"], list(state["losses"])


class Run:
    """Everything a training run checkpoints, built from configs as the trainer builds it."""

    def __init__(self, tmp: Path, ckpt: DCPCheckpoint.Config, *, max_steps: int, seed: int = 0) -> None:
        torch.manual_seed(seed)
        random.seed(seed)
        tok = HuggingFaceTokenizer.Config(path=str(tmp / "tok")).build()
        self.model = DropoutLM(tok.vocab_size)
        self.optimizer = AdamW.Config(lr=0.05, weight_decay=0.1).build(self.model)
        self.scheduler = WarmupDecay.Config(warmup_steps=2).build(self.optimizer, max_steps)
        data = TextDataLoader.Config(num_workers=0, dataset=JsonlSource(paths=(str(tmp / "train.jsonl"),)))
        # 30 short documents packed into 6-token windows: a few batches per epoch, so runs cross epochs.
        self.loader = data.build(LoaderRequest(tok, 0, 1, seq_len=6, micro_batch_size=4, seed=3))
        self.loss = CausalLMLoss.Config().build()
        self.tally = Tally()
        self.ckpt = ckpt.build(
            self.model,
            self.optimizer,
            self.scheduler,
            self.loader,
            train_state=self.tally,
            max_steps=max_steps,
        )

    def start(self) -> int:
        """``load()`` then a fresh iterator over the loader's position, as the trainer does."""
        step = self.ckpt.load()
        self.batches = iter(self.loader)
        return step

    def train(self, first: int, last: int, *, last_step: int | None = None) -> list[float]:
        for step in range(first, last + 1):
            batch = next(self.batches)
            scale = 1.0 + random.random()  # a Python-RNG draw per step
            loss = self.loss(self.model(batch["input_ids"]), batch["labels"]) * scale
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
            self.tally.tokens += batch["input_ids"].numel()
            self.tally.losses.append(loss.item())
            self.ckpt.maybe_save(step, last_step=step == last_step)
        return self.tally.losses[first - 1 : last]


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    train_tokenizer(tmp_path / "tok")
    write_jsonl(tmp_path / "train.jsonl", 30)
    return tmp_path


def cfg(tmp: Path, **kw: Any) -> DCPCheckpoint.Config:
    return DCPCheckpoint.Config(**{"enable": True, "folder": str(tmp / "ckpt"), "keep_latest_k": 0, **kw})


K, N = 5, 7


def test_resumed_losses_equal_the_straight_run_bitwise(tmp: Path) -> None:
    straight = Run(tmp, cfg(tmp, interval=K), max_steps=K + N)
    assert straight.start() == 0
    head = straight.train(1, K)
    tail = straight.train(K + 1, K + N)
    assert len(straight.loader) < K + N  # the data position crosses an epoch boundary

    resumed = Run(tmp, cfg(tmp, load_step=K), max_steps=K + N, seed=99)  # other init and RNG streams
    assert resumed.start() == K
    assert resumed.tally.losses == head  # the trainer's state came back
    assert resumed.tally.tokens == K * 4 * 6
    assert resumed.train(K + 1, K + N) == tail  # bitwise
    for (name, a), b in zip(
        straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


def test_without_the_rng_states_the_resumed_run_differs(tmp: Path) -> None:
    # The control of the test above: dropout masks and loss scales come from the restored generators.
    straight = Run(tmp, cfg(tmp, interval=K), max_steps=K + N)
    straight.start()
    straight.train(1, K)
    tail = straight.train(K + 1, K + N)
    resumed = Run(tmp, cfg(tmp, load_step=K, exclude_from_loading=("rng",)), max_steps=K + N, seed=99)
    assert resumed.start() == K
    assert resumed.train(K + 1, K + N) != tail


def test_a_larger_max_steps_on_resume_follows_the_new_schedule(tmp: Path) -> None:
    first = Run(tmp, cfg(tmp, interval=4, last_save_model_only=False), max_steps=8)
    first.start()
    first.train(1, 8, last_step=8)
    longer = Run(tmp, cfg(tmp), max_steps=20)
    assert longer.start() == 8
    reference = WarmupDecay.Config(warmup_steps=2).build(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.05), 20
    )
    expected = []
    for _ in range(20):
        expected.append(reference.get_last_lr()[0])
        reference.optimizer.step()
        reference.step()
    seen = []
    for step in range(9, 21):
        seen.append(longer.optimizer.param_groups[0]["lr"])
        longer.train(step, step)
    assert seen == pytest.approx(expected[8:], rel=1e-12)
    assert seen[-1] == pytest.approx(0.1 * 0.05, abs=1e-12)  # the new schedule ends at step 20 ...
    assert seen[0] > 0.5 * 0.05  # ... so step 9 is mid-decay, not held at the end of the old 8-step one


def finished_run(tmp: Path, *, interval: int, max_steps: int = 6) -> Run:
    """A run of ``max_steps`` steps whose final save is the weights-only export (the default)."""
    run = Run(tmp, cfg(tmp, interval=interval), max_steps=max_steps)
    run.start()
    run.train(1, max_steps, last_step=max_steps)
    return run


@pytest.mark.parametrize("max_steps", [6, 4, None])
def test_a_run_that_ended_with_an_export_is_finished(tmp: Path, max_steps: int | None) -> None:
    finished_run(tmp, interval=4)
    assert complete_steps(tmp / "ckpt") == [4, 6]
    again = Run(tmp, cfg(tmp), max_steps=6)
    again.ckpt.max_steps = max_steps
    before = again.model.head.weight.detach().clone()
    assert again.start() == 6  # the trainer sees step >= max_steps: "already finished at step 6"
    assert torch.equal(again.model.head.weight.detach(), before)  # nothing was loaded
    assert not again.optimizer.state_dict()["state"]


def test_extending_past_an_export_resumes_the_newest_full_checkpoint(
    tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    finished_run(tmp, interval=2)
    longer = Run(tmp, cfg(tmp), max_steps=10)
    assert longer.start() == 4  # step 6 is the export; 2 and 4 are full
    assert longer.scheduler.last_epoch == 4
    assert longer.tally.tokens == 4 * 4 * 6
    assert (
        f"step 6 in {tmp / 'ckpt'} is a weights-only export and training.max_steps is now 10: resuming "
        "from the full checkpoint of step 4"
    ) in caplog.text


def test_extending_past_an_export_without_a_full_checkpoint_is_refused(tmp: Path) -> None:
    finished_run(tmp, interval=100)
    folder = tmp / "ckpt"
    assert complete_steps(folder) == [6]
    with pytest.raises(CheckpointNotResumableError) as caught:
        Run(tmp, cfg(tmp), max_steps=10).start()
    assert str(caught.value) == (
        f"checkpoint.folder '{folder}': step 6 is a weights-only export (the final save with "
        "checkpoint.last_save_model_only: true) and training.max_steps is now 10; it holds no optimizer, "
        "scheduler or data state, so training cannot resume from it and no earlier full checkpoint "
        "remains. Set checkpoint.load_step to a full checkpoint, or start a new run from these weights "
        f"with checkpoint.initial_load_path: '{folder / 'step-6'}' and another checkpoint.folder; set "
        "checkpoint.last_save_model_only: false to keep final checkpoints resumable."
    )
    assert isinstance(caught.value, ValueError)


def test_load_step_naming_an_export_of_an_extended_run_is_refused(tmp: Path) -> None:
    finished_run(tmp, interval=2)
    with pytest.raises(
        CheckpointNotResumableError,
        match=r"step 6 is a weights-only export .* so training cannot resume from it\. Set checkpoint",
    ):
        Run(tmp, cfg(tmp, load_step=6), max_steps=10).start()
    assert Run(tmp, cfg(tmp, load_step=2), max_steps=10).start() == 2


def test_initial_load_path_with_full_state(tmp: Path) -> None:
    source = Run(tmp, cfg(tmp, interval=3), max_steps=6)
    source.start()
    source.train(1, 3)
    full = tmp / "ckpt" / "step-3"
    new_folder = str(tmp / "new")
    run = Run(
        tmp,
        cfg(tmp, folder=new_folder, initial_load_path=str(full), initial_load_model_only=False),
        max_steps=6,
    )
    assert run.start() == 3
    tensors = sum(
        key.startswith("model.")
        for key in dcp.FileSystemReader(str(full)).read_metadata().state_dict_metadata
    )
    assert run.ckpt.loaded == (
        f"warm start from {full}: the full state of step 3 ({tensors} model tensors, optimizer, schedule, "
        "data position)"
    )
    assert run.scheduler.last_epoch == 3
    assert run.tally.tokens == 3 * 4 * 6
    assert run.optimizer.state_dict()["state"]
    weights_only = Run(tmp, cfg(tmp, folder=new_folder, initial_load_path=str(full)), max_steps=6)
    assert weights_only.start() == 0  # model only (the default): a new run from these weights
    assert weights_only.scheduler.last_epoch == 0
    assert not weights_only.optimizer.state_dict()["state"]
    assert torch.equal(weights_only.model.head.weight, source.model.head.weight)

    source.train(4, 6, last_step=6)  # the final weights-only export
    export = tmp / "ckpt" / "step-6"
    with pytest.raises(
        CheckpointNotResumableError,
        match=rf"^checkpoint.initial_load_path '{export}' is a weights-only export: it holds no optimizer, "
        r"scheduler or data state; set checkpoint.initial_load_model_only: true$",
    ):
        Run(
            tmp,
            cfg(tmp, folder=new_folder, initial_load_path=str(export), initial_load_model_only=False),
            max_steps=6,
        ).start()
    with pytest.raises(
        FileNotFoundError, match=r"checkpoint.initial_load_path '.*nowhere' is not a complete"
    ):
        Run(tmp, cfg(tmp, folder=new_folder, initial_load_path=str(tmp / "nowhere")), max_steps=6).start()


def test_without_enable_the_folder_is_neither_resumed_nor_touched(tmp: Path) -> None:
    source = Run(tmp, cfg(tmp, interval=2), max_steps=6)
    source.start()
    source.train(1, 2)
    (tmp / "ckpt" / ".step-4.partial").mkdir()
    off = Run(tmp, cfg(tmp, enable=False), max_steps=6)
    assert off.start() == 0
    assert (tmp / "ckpt" / ".step-4.partial").is_dir()
    off_with_init = Run(
        tmp, cfg(tmp, enable=False, initial_load_path=str(tmp / "ckpt" / "step-2")), max_steps=6
    )
    assert off_with_init.start() == 0
    assert torch.equal(off_with_init.model.head.weight, source.model.head.weight)


def test_half_written_checkpoints_are_removed_at_start_and_never_loaded(tmp: Path) -> None:
    run = Run(tmp, cfg(tmp, interval=2), max_steps=8)
    run.start()
    run.train(1, 4)
    folder = tmp / "ckpt"
    # A save killed before the rename (even one whose .metadata was already written), a step folder
    # without .metadata, and things the manager does not own.
    shutil.copytree(folder / "step-4", folder / ".step-6.partial")
    (folder / ".step-8.partial").mkdir()
    (folder / "step-9").mkdir()
    (folder / "step-9" / "__0_0.distcp").write_bytes(b"half")
    (folder / "notes").mkdir()
    fresh = Run(tmp, cfg(tmp), max_steps=8, seed=5)  # building the manager cleans up
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "notes", "step-2", "step-4"]  # runs open
    assert fresh.start() == 4


@pytest.mark.parametrize(
    ("excluded", "fresh_parts"),
    [
        (("optimizer",), {"optimizer"}),
        (("lr_scheduler",), {"lr_scheduler"}),
        (("dataloader",), {"dataloader"}),
        (("train_state",), {"train_state"}),
        (("rng",), set()),
        (
            ("optimizer", "lr_scheduler", "dataloader", "rng", "train_state"),
            {"optimizer", "lr_scheduler", "dataloader", "train_state"},
        ),
    ],
)
def test_exclude_from_loading_starts_those_parts_fresh(
    tmp: Path, excluded: tuple[str, ...], fresh_parts: set[str]
) -> None:
    source = Run(tmp, cfg(tmp, interval=3), max_steps=6)
    source.start()
    source.train(1, 3)
    run = Run(tmp, cfg(tmp, exclude_from_loading=excluded), max_steps=6, seed=1)
    assert run.start() == 3
    assert torch.equal(run.model.head.weight, source.model.head.weight)  # the model always loads
    observed = {
        "optimizer": not run.optimizer.state_dict()["state"],
        "lr_scheduler": run.scheduler.last_epoch == 0,
        "dataloader": run.loader.state_dict()["batch_index"] == 0,
        "train_state": run.tally.tokens == 0,
    }
    assert {part for part, fresh in observed.items() if fresh} == fresh_parts
    # The optimizer's lr follows the scheduler's position, restored or not.
    assert run.optimizer.param_groups[0]["lr"] == run.scheduler.get_last_lr()[0]


def test_a_part_missing_from_the_checkpoint_is_named(tmp: Path) -> None:
    source = Run(tmp, cfg(tmp, interval=3), max_steps=6)
    source.ckpt.state.train_state = None  # saved without the trainer's state
    source.start()
    source.train(1, 3)
    with pytest.raises(
        ValueError,
        match=r"holds no 'train_state' state; add 'train_state' to "
        r"checkpoint.exclude_from_loading to start it fresh",
    ):
        Run(tmp, cfg(tmp), max_steps=6).start()
    assert Run(tmp, cfg(tmp, exclude_from_loading=("train_state",)), max_steps=6).start() == 3


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_export_dtype_is_the_dtype_of_the_final_export(tmp: Path, dtype: str) -> None:
    run = Run(tmp, cfg(tmp, interval=100, export_dtype=dtype), max_steps=2)
    run.start()
    run.train(1, 2, last_step=2)
    meta = dcp.FileSystemReader(str(tmp / "ckpt" / "step-2")).read_metadata().state_dict_metadata
    assert {m.properties.dtype for key, m in meta.items()} == {getattr(torch, dtype)}
    assert set(meta) == {f"model.{name}" for name in run.model.state_dict()}


# The background thread's single-process warning is silenced by a process-wide filter that pytest's
# per-test warning capture resets, so it is ignored here explicitly.
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.parametrize("mode", ["async", "async_with_pinned_mem"])
def test_async_saves_resume_exactly(tmp: Path, mode: str) -> None:
    # On a machine without CUDA 'async_with_pinned_mem' is plain 'async'.
    straight = Run(tmp, cfg(tmp, interval=K, async_mode=mode, last_save_model_only=False), max_steps=K + N)
    straight.start()
    straight.train(1, K)
    tail = straight.train(K + 1, K + N, last_step=K + N)
    straight.ckpt.close()
    assert complete_steps(tmp / "ckpt") == [K, 2 * K, K + N]
    resumed = Run(tmp, cfg(tmp, load_step=K), max_steps=K + N, seed=3)
    assert resumed.start() == K
    assert resumed.train(K + 1, K + N) == tail


def test_a_save_outside_the_interval_and_a_repeated_save(tmp: Path) -> None:
    # What the trainer does on SIGTERM: save the step just finished, then close.
    run = Run(tmp, cfg(tmp, interval=4), max_steps=12)
    run.start()
    run.train(1, 4)
    metadata = tmp / "ckpt" / "step-4" / ".metadata"
    written = metadata.stat().st_mtime_ns
    assert run.ckpt.save(4) == tmp / "ckpt" / "step-4"  # just saved by maybe_save: nothing written
    assert metadata.stat().st_mtime_ns == written
    run.train(5, 6)
    run.ckpt.save(6)
    run.ckpt.close()
    assert complete_steps(tmp / "ckpt") == [4, 6]
    assert Run(tmp, cfg(tmp), max_steps=12).start() == 6


@pytest.mark.parametrize(("first_step", "saved"), [(True, [1, 3]), (False, [3])])
def test_enable_first_step_checkpoint_saves_after_step_one(
    tmp: Path, first_step: bool, saved: list[int]
) -> None:
    run = Run(tmp, cfg(tmp, interval=3, enable_first_step_checkpoint=first_step), max_steps=6)
    run.start()
    run.train(1, 4)
    assert complete_steps(tmp / "ckpt") == saved
