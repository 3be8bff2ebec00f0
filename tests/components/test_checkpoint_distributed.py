"""The checkpoint manager under FSDP2 with two gloo processes launched by torchrun.

Each test launches this file under ``torchrun --standalone --nproc-per-node 2``; ``main`` below is the
worker. A tiny model with dropout is ``fully_shard``-ed, trained with AdamW, the real scheduler and the real
data loader (each rank its own data shard), and checkpointed through ``DCPCheckpoint.Config.build``.
"""

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is required", allow_module_level=True)

from tests.support.processes import torchrun  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

K, N = 4, 5
TIMEOUT = 240


def _torchrun(tmp: Path, *args: str) -> None:
    """Run the worker on two processes; a hang fails after TIMEOUT and takes the workers down with it."""
    done = torchrun(2, __file__, str(tmp), *args, timeout=TIMEOUT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    from tests.support.components import train_tokenizer, write_jsonl

    train_tokenizer(tmp_path / "tok")
    write_jsonl(tmp_path / "train.jsonl", 40)
    return tmp_path


def _losses(tmp: Path, name: str) -> dict[str, list[float]]:
    return {rank: json.loads((tmp / f"{name}.rank{rank}.json").read_text()) for rank in ("0", "1")}


def test_fsdp_resume_matches_the_straight_run(tmp: Path) -> None:
    _torchrun(tmp, "straight")
    _torchrun(tmp, "resume")
    straight, resumed = _losses(tmp, "straight"), _losses(tmp, "resume")
    for rank in ("0", "1"):
        assert len(straight[rank]) == K + N
        assert resumed[rank] == pytest.approx(straight[rank][K:], abs=1e-6, rel=0)
    assert straight["0"][K:] != straight["1"][K:]  # each rank trains on its own data


def test_fsdp_async_saves_finish_and_load(tmp: Path) -> None:
    # Async saves at steps 2, 4, 6 while training goes on, then the synchronous weights-only export at
    # step 7; the worker reloads every published checkpoint and compares it with the weights it saved.
    _torchrun(tmp, "async")
    assert sorted(p.name for p in (tmp / "ckpt").iterdir()) == ["step-2", "step-4", "step-6", "step-7"]
    assert json.loads((tmp / "async.rank0.json").read_text()) == {"checked": [2, 4, 6, 7]}


# -- worker (run by torchrun) -----------------------------------------------------------------------------
class _Tally:
    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = state["steps"]


class _Run:
    def __init__(self, tmp: Path, max_steps: int, **ckpt: Any) -> None:
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        from hyper_parallel.components.checkpoint import DCPCheckpoint
        from hyper_parallel.components.dataloader import JsonlSource, LoaderRequest, TextDataLoader
        from hyper_parallel.components.loss import CausalLMLoss
        from hyper_parallel.components.lr_scheduler import WarmupDecay
        from hyper_parallel.components.optimizer import AdamW
        from hyper_parallel.components.tokenizer import HuggingFaceTokenizer
        from tests.support.components import DropoutLM

        rank = dist.get_rank()
        tok = HuggingFaceTokenizer.Config(path=str(tmp / "tok")).build()
        torch.manual_seed(0)  # the same initial weights on every rank before sharding
        self.model = DropoutLM(tok.vocab_size)
        fully_shard(self.model.mix)
        fully_shard(self.model)
        torch.manual_seed(100 + rank)  # then each rank its own dropout masks
        random.seed(rank)
        self.optimizer = AdamW.Config(lr=0.05, weight_decay=0.1).build(self.model)
        self.scheduler = WarmupDecay.Config(warmup_steps=2).build(self.optimizer, max_steps)
        data = TextDataLoader.Config(num_workers=0, dataset=JsonlSource(paths=(str(tmp / "train.jsonl"),)))
        self.loader = data.build(LoaderRequest(tok, rank, 2, seq_len=6, micro_batch_size=2, seed=3))
        self.loss = CausalLMLoss.Config().build()
        self.tally = _Tally()
        config = DCPCheckpoint.Config(
            **{"enable": True, "folder": str(tmp / "ckpt"), "keep_latest_k": 0, **ckpt}
        )
        self.ckpt = config.build(
            self.model,
            self.optimizer,
            self.scheduler,
            self.loader,
            train_state=self.tally,
            max_steps=max_steps,
        )
        self.max_steps = max_steps

    def start(self) -> int:
        step = self.ckpt.load()
        self.batches = iter(self.loader)
        return step

    def step(self, step: int) -> float:
        batch = next(self.batches)
        loss = self.loss(self.model(batch["input_ids"]), batch["labels"]) * (1.0 + random.random())
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.tally.steps += 1
        self.ckpt.maybe_save(step, last_step=step == self.max_steps)
        return float(loss.item())

    def full_weights(self) -> dict[str, Any]:
        return {name: p.full_tensor().detach().clone() for name, p in self.model.named_parameters()}


def _write(tmp: Path, name: str, value: Any) -> None:
    import torch.distributed as dist

    (tmp / f"{name}.rank{dist.get_rank()}.json").write_text(json.dumps(value))


def _straight(tmp: Path) -> None:
    run = _Run(tmp, K + N, interval=K)
    assert run.start() == 0
    _write(tmp, "straight", [run.step(step) for step in range(1, K + N + 1)])
    run.ckpt.close()


def _resume(tmp: Path) -> None:
    run = _Run(tmp, K + N, load_step=K)
    assert run.start() == K
    assert run.tally.steps == K
    _write(tmp, "resume", [run.step(step) for step in range(K + 1, K + N + 1)])
    run.ckpt.close()


def _async(tmp: Path) -> None:
    run = _Run(tmp, 7, interval=2, async_mode="async")
    run.start()
    saved = {}
    for step in range(1, 8):
        run.step(step)
        if step % 2 == 0 or step == 7:
            saved[step] = run.full_weights()
    run.ckpt.close()
    checked = []
    export = str(tmp / "ckpt" / "step-7")
    for step, weights in saved.items():
        # The export (step 7) is read as the weights of a new run; the others are resumed.
        fresh = (
            _Run(tmp, 7, load_step=step) if step < 7 else _Run(tmp, 7, enable=False, initial_load_path=export)
        )
        assert fresh.start() == (step if step < 7 else 0)
        for name, tensor in fresh.full_weights().items():
            assert torch.equal(tensor, weights[name]), (step, name)
        checked.append(step)
    _write(tmp, "async", {"checked": checked})


def main() -> None:
    import torch.distributed as dist

    tmp, mode = Path(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo")
    try:
        {"straight": _straight, "resume": _resume, "async": _async}[mode](tmp)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
