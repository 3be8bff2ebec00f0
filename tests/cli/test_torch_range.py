"""Every command that runs torch refuses a PyTorch older than the supported range in the same words: the
launch scripts and ``evaluate`` (``tests/trainer/test_launch_checks.py``), ``export`` and ``generate`` here,
before any file is read."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from hyper_parallel import export, generate
from hyper_parallel.trainer import machine

OLD = (
    "PyTorch 2.10.0+cu128 is older than 2.11 to 2.13, the range this project supports (FlexAttention, FSDP2 "
    "and DCP APIs it calls)"
)

COMMANDS: dict[str, tuple[Callable[[Sequence[str] | None], int], list[str]]] = {
    "export": (export.main, ["CKPT", "OUT"]),
    "export --adapter-only": (export.main, ["CKPT", "OUT", "--adapter-only"]),
    "generate": (generate.main, ["CKPT", "--prompt", "hi"]),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_export_and_generate_refuse_a_torch_older_than_the_supported_range(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(machine, "_torch_version_text", lambda: "2.10.0+cu128")
    main, argv = COMMANDS[command]
    assert (
        main([a.replace("CKPT", str(tmp_path / "ckpt")).replace("OUT", str(tmp_path / "out")) for a in argv])
        == 2
    )
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", f"{command.split()[0]}: {OLD}\n")
    assert not (tmp_path / "out").exists()
