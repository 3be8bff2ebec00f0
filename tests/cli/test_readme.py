"""README.md's examples run as written (from the repository root, as README says)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def test_the_python_api_example_runs_as_written(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    (block,) = _blocks("python")
    exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "optimizer.lr" in out  # the ConfigError example printed its issue


def test_every_config_file_readme_names_exists() -> None:
    named = set(re.findall(r"configs/[\w.]+\.yaml", README))
    assert named, "README names no config file"
    assert sorted(name for name in named if not (ROOT / name).is_file()) == []
