"""resolve_root, load_config, apply_overrides and dump_config from many threads at once.

Each job is run once single-threaded for the expected result (a config, a dump, or the issues of an
error); then 8 threads run every job many times in different orders and must get exactly the same.
"""

import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from hyper_parallel.config import ConfigError, apply_overrides, dump_config, load_config, resolve_root
from hyper_parallel.config.targets import ALLOWED_TARGETS_ENV

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
THREADS = 8
ROUNDS = 8
RECORDER = "tests.support.import_recorder.RecorderOptimizerConfig"
SGD = "hyper_parallel.components.optimizer.SGD.Config"
BYTES = "hyper_parallel.components.tokenizer.ByteTokenizer.Config"


def _jobs() -> dict[str, Callable[[], Any]]:
    jobs: dict[str, Callable[[], Any]] = {}
    for path in CONFIGS:
        raw = yaml.safe_load(path.read_text())
        base = load_config(path)
        jobs[f"load:{path.name}"] = lambda p=path: load_config(p)
        jobs[f"resolve:{path.name}"] = lambda r=raw: resolve_root(r)
        jobs[f"dump:{path.name}"] = lambda c=base: dump_config(c)
        jobs[f"override:{path.name}"] = lambda c=base: apply_overrides(
            c, {"training.max_steps": "7", "optimizer._target_": SGD, "optimizer.lr": "0.5"}
        )
        jobs[f"bad-override:{path.name}"] = lambda c=base: apply_overrides(
            c, {"training.max_steps": "-3", "optimizer.lrr": "1", "loss.reduction": "avg"}
        )
        # The allowlist is per call: the same document resolves in one thread and is refused in another.
        mixed = {**raw, "optimizer": {"_target_": RECORDER, "lr": 0.25}}
        jobs[f"allowed:{path.name}"] = lambda r=mixed: resolve_root(r, allowed_targets=("tests",))
        jobs[f"refused:{path.name}"] = lambda r=mixed: resolve_root(r)
        jobs[f"override-allowed:{path.name}"] = lambda c=base: apply_overrides(
            c, {"optimizer._target_": RECORDER}, allowed_targets=("tests.support.import_recorder",)
        )
    jobs["bad-file"] = lambda: resolve_root({"model": {"_target_": "os.system"}, "trainingg": {}})
    jobs["factory-error"] = lambda: resolve_root(
        {"model": {"_target_": "hyper_parallel.models.qwen3_5.create_model_spec", "flavor": "9T"}}
    )
    return jobs


def _outcome(job: Callable[[], Any]) -> Any:
    try:
        result = job()
    except ConfigError as exc:
        return ("error", exc.issues)
    if isinstance(result, str):
        return ("dump", result)
    # A config must also dump the same (factory recipes are looked up per object, across threads).
    return ("config", result, dump_config(result))


def test_every_thread_gets_the_single_threaded_result(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOWED_TARGETS_ENV, raising=False)
    jobs = _jobs()
    expected = {name: _outcome(job) for name, job in jobs.items()}
    assert {kind for kind, *_ in expected.values()} == {"config", "dump", "error"}
    assert expected["refused:qwen3_5.yaml"][0] == "error"
    assert expected["allowed:qwen3_5.yaml"][0] == "config"

    barrier = threading.Barrier(THREADS)
    failures: list[str] = []
    counts = [0] * THREADS

    def worker(index: int) -> None:
        order = list(jobs) * ROUNDS
        random.Random(index).shuffle(order)
        barrier.wait()
        for name in order:
            try:
                got = _outcome(jobs[name])
            except Exception as exc:  # anything but ConfigError is a failure, reported below
                failures.append(f"{name}: {type(exc).__name__}: {exc}")
                continue
            if got != expected[name]:
                failures.append(f"{name}: differs from the single-threaded result")
            counts[index] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    assert counts == [len(jobs) * ROUNDS] * THREADS


def test_allowlist_and_locations_do_not_leak_between_threads(tmp_path: Path) -> None:
    """Per-call options live in a context variable: a thread's allowlist or file never reaches another."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  _target_: hyper_parallel.models.qwen3_5.create_model_spec\n  flavor: 9T\n")
    raw = {"model": {"_target_": "hyper_parallel.models.qwen3_5.create_model_spec"}}
    raw = {**raw, "optimizer": {"_target_": RECORDER}, "tokenizer": {"_target_": BYTES}}
    errors: list[str] = []
    resolved = [0] * THREADS
    barrier = threading.Barrier(THREADS)

    def allowed(index: int) -> None:
        barrier.wait()
        for _ in range(50):
            resolve_root(raw, allowed_targets=("tests",))
            resolved[index] += 1

    def refused(index: int) -> None:
        barrier.wait()
        for _ in range(50):
            try:
                resolve_root(raw)
            except ConfigError as exc:
                if [i.path for i in exc.issues] != ["optimizer._target_"] or exc.issues[0].location:
                    errors.append(str(exc))
            else:
                errors.append("resolved without the allowlist")

    def located(index: int) -> None:
        barrier.wait()
        for _ in range(50):
            try:
                load_config(bad)
            except ConfigError as exc:
                if [i.location for i in exc.issues] != [f"{bad}:3:11"]:
                    errors.append(str(exc))

    kinds = [allowed, refused, located, refused, allowed, located, refused, allowed]
    threads = [threading.Thread(target=k, args=(i,)) for i, k in enumerate(kinds)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    # Every "allowed" thread resolved all 50 times (a thread that raised would not have).
    assert resolved == [50 if k is allowed else 0 for k in kinds]
