"""Shared tokenizing and data-parallel validation under ``torchrun --nproc-per-node 2`` with gloo on CPU.

Each test launches this module as the torchrun worker
(``python -m tests.components.test_data_distributed MODE OUT``); every rank writes what it saw to
``OUT/rank<r>.json`` and the test compares that with the same loader or validator built in the test
process without any process group.
"""

import json
import sys
from itertools import islice
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is required", allow_module_level=True)

import hyper_parallel.components.dataloader._tokenizing as runtime_tokenizing  # noqa: E402
from hyper_parallel.components.dataloader import JsonlSource, LoaderRequest, TextDataLoader  # noqa: E402
from hyper_parallel.components.loss import CausalLMLoss  # noqa: E402
from hyper_parallel.components.tokenizer import ByteTokenizer  # noqa: E402
from hyper_parallel.components.validator import LossValidator  # noqa: E402
from tests.support.components import TinyLM, document  # noqa: E402
from tests.support.processes import torchrun  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

DOCS = 41  # odd: the two ranks encode 21 and 20 documents
SEQ = 8
GLOBAL_BATCH = 4
STEPS = 6
CHUNK = 3  # documents per rank per all-gather round: several rounds


class CountingTokenizer:
    """A byte tokenizer that records every text it encodes."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.inner = ByteTokenizer.Config().build()
        self.seen: list[str] = []
        self.fail_on = fail_on

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        self.seen.extend(texts)
        if self.fail_on is not None and self.fail_on in texts:
            raise RuntimeError(f"cannot encode {self.fail_on!r}")
        return list(self.inner.encode_batch(texts))


def text(i: int) -> str:
    return f"doc {i}: {document(i)}"


def write_corpus(folder: Path) -> Path:
    path = folder / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": text(i)}) + "\n" for i in range(DOCS)), encoding="utf-8")
    return path


def train_cfg(corpus: Path, **dataset: Any) -> TextDataLoader.Config:
    return TextDataLoader.Config(num_workers=0, dataset=JsonlSource(paths=(str(corpus),), **dataset))


def val_cfg(corpus: Path, steps: int) -> LossValidator.Config:
    return LossValidator.Config(enable=True, steps=steps, dataset=JsonlSource(paths=(str(corpus),)))


def rows(batch: dict[str, Any]) -> list[list[int]]:
    return [list(map(int, row)) for row in batch["input_ids"].tolist()]


def model(vocab: int) -> Any:
    torch.manual_seed(0)
    return TinyLM(vocab)


# -- the torchrun worker -------------------------------------------------------------------------------


def _worker(mode: str, out: Path) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    runtime_tokenizing._TOKENIZE_CHUNK = CHUNK
    corpus = out / "corpus.jsonl"
    report: dict[str, Any] = {}
    try:
        if mode == "train":
            tok = CountingTokenizer()
            loader = train_cfg(corpus).build(
                LoaderRequest(
                    tok,
                    rank,
                    world,
                    seq_len=SEQ,
                    micro_batch_size=GLOBAL_BATCH // world,
                    seed=3,
                    process_group=dist.group.WORLD,
                ),
            )
            report["seen"] = tok.seen
            report["steps"] = [rows(b) for b in islice(loader, STEPS)]
            capped = CountingTokenizer()
            train_cfg(corpus, max_samples=4).build(
                LoaderRequest(
                    capped,
                    rank,
                    world,
                    seq_len=SEQ,
                    micro_batch_size=1,
                    seed=3,
                    process_group=dist.group.WORLD,
                )
            )
            report["seen_capped"] = capped.seen
        elif mode == "validate":
            for steps in (-1, 3):
                cfg = val_cfg(corpus, steps)
                tok = ByteTokenizer.Config().build()
                # Data parallel over both ranks: each holds half the set, sums reduced over the world.
                loader = cfg.build_dataloader(
                    LoaderRequest(
                        tok,
                        rank,
                        world,
                        seq_len=SEQ,
                        micro_batch_size=2,
                        seed=0,
                        process_group=dist.group.WORLD,
                    )
                )
                dp = cfg.build(loader, CausalLMLoss.Config().build(), process_group=dist.group.WORLD)
                report[f"dp{steps}"] = dp.validate(model(tok.vocab_size), 1)
                # Tensor parallel of two (one data-parallel rank): the same samples, a group of one.
                own = [dist.new_group([r]) for r in range(world)][rank]
                alone = cfg.build_dataloader(
                    LoaderRequest(
                        tok,
                        0,
                        1,
                        seq_len=SEQ,
                        micro_batch_size=2,
                        seed=0,
                    )
                )
                tp = cfg.build(alone, CausalLMLoss.Config().build(), process_group=own)
                report[f"tp{steps}"] = tp.validate(model(tok.vocab_size), 1)
        elif mode == "error":
            for case in ("tokenizer", "different data"):
                tok = CountingTokenizer(fail_on=text(5) if case == "tokenizer" else None)
                data = out / ("short.jsonl" if case == "different data" and rank == 1 else "corpus.jsonl")
                try:
                    train_cfg(data).build(
                        LoaderRequest(
                            tok,
                            rank,
                            world,
                            seq_len=SEQ,
                            micro_batch_size=1,
                            seed=0,
                            process_group=dist.group.WORLD,
                        ),
                    )
                except ValueError as exc:
                    report[case] = str(exc)
        (out / f"rank{rank}.json").write_text(json.dumps(report), encoding="utf-8")
    finally:
        dist.destroy_process_group()


# -- the tests -----------------------------------------------------------------------------------------


def launch(mode: str, out: Path) -> list[dict[str, Any]]:
    done = torchrun(2, "-m", "tests.components.test_data_distributed", mode, str(out), timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(2)]


def test_each_rank_tokenizes_its_share_and_steps_hold_the_same_samples(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path)
    ranks = launch("train", tmp_path)
    for r, report in enumerate(ranks):
        assert report["seen"] == [text(i) for i in range(DOCS) if i % 2 == r]
    # Early stop (max_samples) is agreed by both ranks: neither encodes past the round that filled it.
    assert len(ranks[0]["seen_capped"]) + len(ranks[1]["seen_capped"]) < DOCS
    assert ranks[0]["seen_capped"] == [text(i) for i in range(0, 2 * len(ranks[0]["seen_capped"]), 2)]
    # One process, the whole global batch per micro-batch and no group: the same samples at every step.
    alone = CountingTokenizer()
    single = train_cfg(corpus).build(
        LoaderRequest(
            alone,
            0,
            1,
            seq_len=SEQ,
            micro_batch_size=GLOBAL_BATCH,
            seed=3,
        )
    )
    assert alone.seen == [text(i) for i in range(DOCS)]
    for step, batch in enumerate(islice(single, STEPS)):
        both = ranks[0]["steps"][step] + ranks[1]["steps"][step]
        assert sorted(both) == sorted(rows(batch))
        assert both != rows(batch)  # dealt, not copied: rank 0 holds positions 0 and 2 of the step


def test_validation_loss_is_the_same_for_one_and_two_processes(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path)
    ranks = launch("validate", tmp_path)
    for steps in (-1, 3):
        cfg = val_cfg(corpus, steps)
        tok = ByteTokenizer.Config().build()
        loader = cfg.build_dataloader(LoaderRequest(tok, 0, 1, seq_len=SEQ, micro_batch_size=2, seed=0))
        single = cfg.build(loader, CausalLMLoss.Config().build()).validate(model(tok.vocab_size), 1)
        samples = len(loader.samples) if steps == -1 else steps * 2
        assert single["tokens"] == samples * (SEQ - 1)
        for report in ranks:
            for layout in ("dp", "tp"):
                result = report[f"{layout}{steps}"]
                assert result["loss"] == pytest.approx(single["loss"], rel=0, abs=1e-6)
                assert result["tokens"] == single["tokens"]  # not doubled by the other tensor-parallel rank
        assert ranks[0][f"dp{steps}"]["batches"] == ranks[1][f"dp{steps}"]["batches"]


def test_a_failure_on_one_rank_stops_both_with_its_message(tmp_path: Path) -> None:
    write_corpus(tmp_path)
    (tmp_path / "short.jsonl").write_text(
        "".join(json.dumps({"text": text(i)}) + "\n" for i in range(DOCS - 1)), encoding="utf-8"
    )
    ranks = launch("error", tmp_path)
    failed = "rank 1 of the data group could not read or tokenize: RuntimeError: cannot encode 'doc 5: "
    different = (
        "the ranks of the data group read different documents ([5, 4] in one round): every rank must see "
        "the same dataset"
    )
    for report in ranks:
        assert report["tokenizer"].startswith(failed)
        assert report["different data"] == different


if __name__ == "__main__":
    _worker(sys.argv[1], Path(sys.argv[2]))
