"""Profiler.Config.build(rank): torch.profiler on a wait/warmup/active schedule, or a no-op."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hyper_parallel.components.profiler import Profiler, TorchProfiler

REPO = Path(__file__).resolve().parents[2]

_PROBE = """
import sys
from hyper_parallel.components.profiler import TorchProfiler
prof = TorchProfiler.Config(enable=False, save_traces_folder=sys.argv[1]).build()
with prof:
    for _ in range(3):
        prof.step()
print(type(prof).__name__, "torch" in sys.modules)
"""


@pytest.mark.multiprocess
def test_disabled_profiler_is_a_no_op_without_torch(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    (shadow / "torch").mkdir(parents=True)
    (shadow / "torch" / "__init__.py").write_text("raise ImportError('torch must not be imported')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path / "traces")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["NullProfiler", "False"]
    assert not (tmp_path / "traces").exists()


def test_schedule_writes_one_trace_per_cycle(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    cfg = TorchProfiler.Config(
        enable=True, profile_freq=5, warmup=1, active=2, save_traces_folder=str(tmp_path), record_shapes=True
    )
    prof = cfg.build(rank=3)
    model = torch.nn.Linear(8, 8)
    with prof:
        for _ in range(12):
            model(torch.randn(4, 8)).sum().backward()
            prof.step()
    # wait = 5 - 1 - 2 = 2: each 5-step cycle records steps 4-5, 9-10; the trace is ready at 5 and 10.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iteration_10", "iteration_5"]
    assert prof.traces == [
        tmp_path / "iteration_5" / "rank3_trace.json",
        tmp_path / "iteration_10" / "rank3_trace.json",
    ]
    events = json.loads(prof.traces[0].read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert "aten::addmm" in names
    assert any("ProfilerStep#" in str(n) for n in names)
    assert any("Input Dims" in e.get("args", {}) for e in events)


def test_explicit_wait(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    cfg = TorchProfiler.Config(
        enable=True, profile_freq=4, wait=3, warmup=0, active=1, save_traces_folder=str(tmp_path)
    )
    with pytest.warns(UserWarning, match="won't be using warmup"):
        prof = cfg.build()
    with prof:
        for _ in range(8):
            torch.ones(3).sum()
            prof.step()
    assert [p.parent.name for p in prof.traces] == ["iteration_4", "iteration_8"]


def test_base_config_names_the_class() -> None:
    with pytest.raises(NotImplementedError, match=r"Profiler\.Config"):
        Profiler.Config().build()


def test_record_memory_and_with_stack_reach_the_trace(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    traces = {}
    for flag in ("record_memory", "with_stack"):
        cfg = TorchProfiler.Config(
            enable=True,
            profile_freq=2,
            warmup=0,
            active=1,
            save_traces_folder=str(tmp_path / flag),
            **{flag: True},
        )
        prof = cfg.build()
        with prof:
            for _ in range(2):
                torch.nn.functional.linear(torch.randn(4, 8), torch.randn(8, 8)).sum()
                prof.step()
        traces[flag] = json.loads(prof.traces[0].read_text())["traceEvents"]
    assert any(e.get("name") == "[memory]" for e in traces["record_memory"])
    assert any(e.get("cat") == "python_function" for e in traces["with_stack"])
