"""README.md's examples run as written (from a folder holding the shipped configs, as the root does).

They run in the test's temporary folder, with a copy of ``configs/``: what they write (``runs/...``) lands
there, never in the checkout, and the README example's test checks that the checkout is left as it was.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.checkout import checkout_snapshot

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def test_the_python_api_example_runs_as_written_and_leaves_the_checkout_as_it_was(
    monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    before = checkout_snapshot()
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    (block,) = _blocks("python")
    exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "optimizer.lr" in out  # the ConfigError example printed its issue
    assert (tmp_path / "runs" / "llama3_debug" / "metrics.jsonl").is_file()  # the run wrote here ...
    assert checkout_snapshot() == before  # ... and nothing in the checkout


def test_every_config_file_readme_names_exists() -> None:
    named = set(re.findall(r"configs/[\w.]+\.yaml", README))
    assert named, "README names no config file"
    assert sorted(name for name in named if not (ROOT / name).is_file()) == []
