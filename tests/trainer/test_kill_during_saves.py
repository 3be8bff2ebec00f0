"""``kill -9`` at random points of checkpoint saves, then a relaunch: it resumes the newest complete step.

One process trains the tiny debug model with a checkpoint every step. Each iteration kills it with
SIGKILL a random delay after one of its saves began (which save, and the delay within about one save's
duration, drawn from a seeded RNG), then relaunches the same command: the relaunch must say it resumes
the newest step folder the killed run published (the step whose save was cut short, or the one before),
and no launch may print a traceback. The last launch runs to ``max_steps``.

``HP_KILL_LOOP_ITERATIONS`` sets the number of kills (2 in the suite), ``HP_KILL_LOOP_SEED`` the
seed (random otherwise; it is printed, and named in every failure). The launches are forks of one process
that has imported the project (``tests/support/relauncher.py`` says why that is the same launch), so an
iteration costs about a second.
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.support import ROOT
from tests.support.processes import clean_env
from tests.support.trainer import as_flags, debug_config_path, tiny_overrides

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]

RELAUNCHER = str(Path(__file__).parents[1] / "support" / "relauncher.py")
#: Kills in the suite; ``HP_KILL_LOOP_ITERATIONS`` runs more (the issue asks for >= 20 once).
KILLS = int(os.environ.get("HP_KILL_LOOP_ITERATIONS", "2"))
#: Seconds any one event of a launch (start-up to its first save, a save, an exit) may take.
WAIT = 120.0


class Relauncher:
    """The relauncher process: ``launch(args)`` forks a ``train_lm`` run; ``next()`` reads its reports."""

    def __init__(self) -> None:
        env = clean_env(PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
        self.proc = subprocess.Popen(
            [sys.executable, RELAUNCHER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
            start_new_session=True,  # stopped with its children at the end, whatever happened
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.count = 0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("eof")

    def next(self) -> str:
        try:
            line = self.lines.get(timeout=WAIT)
        except queue.Empty:
            pytest.fail(f"the relauncher said nothing for {WAIT} s")
        assert line != "eof", "the relauncher ended"
        return line

    def launch(self, args: list[str], logs: Path, fault: str | None = None) -> tuple[int, Path, Path]:
        """Fork a launch of ``train_lm ARGS`` (its output in ``logs``); its PID and output files."""
        self.count += 1
        out, err = logs / f"launch{self.count}.out", logs / f"launch{self.count}.err"
        assert self.proc.stdin is not None
        request = {"args": args, "out": str(out), "err": str(err), "fault": fault}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        started = self.next()
        assert started.startswith("started "), started
        return int(started.split()[1]), out, err

    def until_exit(self) -> tuple[int, list[str]]:
        """The exit status of the launch under way and the reports it gave before ending."""
        reports = []
        while not (line := self.next()).startswith("exited "):
            reports.append(line)
        return int(line.split()[1]), reports

    def close(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue


@pytest.fixture(scope="module")
def relauncher() -> Iterator[Relauncher]:
    """One relauncher for the module's tests (it costs one interpreter's imports)."""
    runner = Relauncher()
    try:
        yield runner
    finally:
        runner.close()


def _command(folder: Path, max_steps: int) -> list[str]:
    overrides = tiny_overrides(
        "llama3",
        **{
            "training.max_steps": str(max_steps),
            "checkpoint.enable": "true",
            "checkpoint.folder": str(folder),
            "checkpoint.interval": "1",
            "checkpoint.keep_latest_k": "3",  # pruning is part of a save: a kill may land in it too
        },
    )
    return ["--config-file", str(debug_config_path("llama3")), *as_flags(overrides)]


def _published(folder: Path) -> int:
    """The newest step folder a save published (renamed from its partial folder), 0 for none."""
    steps = [int(m.group(1)) for p in folder.iterdir() if (m := re.fullmatch(r"step-(\d+)", p.name))]
    return max(steps, default=0)


def _resumed(out: Path) -> int:
    banner = out.read_text().splitlines()[0]
    match = re.search(r"resuming at step (\d+)", banner)
    return int(match.group(1)) if match else 0


def _no_traceback(err: Path, where: str) -> None:
    text = err.read_text()
    assert "Traceback" not in text, f"{where}:\n{text[-4000:]}"


@pytest.mark.timeout(120 + 10 * KILLS)
def test_kill_9_at_random_points_of_saves_resumes_the_newest_complete_step_every_time(
    relauncher: Relauncher, tmp_path: Path
) -> None:
    kills = KILLS
    seed = int(os.environ.get("HP_KILL_LOOP_SEED", random.SystemRandom().randrange(2**32)))
    rng = random.Random(seed)
    print(f"kill loop: {kills} kills, seed {seed} (HP_KILL_LOOP_SEED={seed} repeats it)")
    folder = tmp_path / "ckpt"
    command = _command(folder, max_steps=3 * kills + 4)  # a launch is killed within its third save
    save_seconds = 0.1  # the delay's range until a save was timed
    mid_save = 0
    started = time.monotonic()
    expected = 0  # the step the next launch must resume
    for kill in range(1, kills + 1):
        where = f"kill {kill} of {kills} (seed {seed})"
        pid, out, err = relauncher.launch(command, tmp_path)
        target, begun, seen = rng.randint(1, 3), 0, []
        while begun < target:
            line = relauncher.next()
            seen.append(line)
            assert not line.startswith("exited "), f"{where}: it ended first: {err.read_text()[-3000:]}"
            if line.startswith("save-begins "):
                begun += 1
            elif line.startswith("save-ends "):
                save_seconds = float(line.split()[2])
        time.sleep(rng.uniform(0.0, 1.2 * save_seconds))
        os.kill(pid, signal.SIGKILL)
        status, reports = relauncher.until_exit()
        assert status == -signal.SIGKILL, f"{where}: {status}: {err.read_text()[-3000:]}"
        assert _resumed(out) == expected, f"{where}: {out.read_text()[:500]}"
        _no_traceback(err, where)
        last = [*seen, *reports][-1]
        cut = int(last.split()[1])
        mid_save += last.startswith("save-begins ")
        expected = _published(folder)
        # the save cut short published its step or not; nothing older than the step before it is resumed
        assert expected in (cut - 1, cut), f"{where}: killed in the save of step {cut}, newest {expected}"
    _, out, err = relauncher.launch(command, tmp_path)
    status, _ = relauncher.until_exit()
    assert status == 0, err.read_text()[-3000:]
    assert _resumed(out) == expected
    assert f"done: step {3 * kills + 4}," in out.read_text()
    _no_traceback(err, "the last launch")
    print(
        f"kill loop: {kills} kills ({mid_save} inside a save, the rest between saves), {kills} resumed "
        f"the newest complete step, {time.monotonic() - started:.1f} s, seed {seed}"
    )


def test_a_second_sigint_during_a_save_exits_130_and_the_next_start_ignores_the_half_written_save(
    relauncher: Relauncher, tmp_path: Path
) -> None:
    folder = tmp_path / "ckpt"
    command = _command(folder, max_steps=3)
    _, out, err = relauncher.launch(command, tmp_path, fault="sigint-twice-in-save")
    status, reports = relauncher.until_exit()
    assert status == 130, err.read_text()[-3000:]
    assert reports == ["save-begins 1"]  # it ended inside the first save
    assert err.read_text().endswith(
        "SIGINT again: exiting now; a checkpoint being saved is incomplete and the next start ignores it\n"
    )
    assert sorted(p.name for p in folder.iterdir()) == [".lock", ".step-1.partial"]
    _, out, err = relauncher.launch(command, tmp_path)
    status, _ = relauncher.until_exit()
    assert status == 0, err.read_text()[-3000:]
    assert _resumed(out) == 0  # the half-written step 1 was not taken for a checkpoint
    assert "done: step 3," in out.read_text()
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == [
        "step-1",
        "step-2",
        "step-3",
    ]
    _no_traceback(err, "the relaunch")
