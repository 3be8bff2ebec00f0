"""Shared by the prepared-data tests: configs naming a tokenizer, and ``prepare`` run in this process."""

import io
from pathlib import Path

from hyper_parallel.data.__main__ import main

BYTES_CONFIG = """\
model:
  _target_: hyper_parallel.models.llama3.create_model_spec
  flavor: debugmodel
tokenizer:
  _target_: hyper_parallel.components.tokenizer.ByteTokenizer.Config
"""


def tokenizer_config(folder: Path, tokenizer_path: Path | None = None) -> Path:
    """A training config whose tokenizer is the byte tokenizer, or the Hugging Face one at the path."""
    text = BYTES_CONFIG
    if tokenizer_path is not None:
        text = text.replace("ByteTokenizer.Config", f"HuggingFaceTokenizer.Config\n  path: {tokenizer_path}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def run_prepare(*args: str | Path) -> tuple[int, str, str]:
    """``python -m hyper_parallel.data ARGS`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    status = main([str(a) for a in args], out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def prepare(inputs: list[Path], output: Path, config: Path, *extra: str) -> Path:
    """Prepare ``inputs`` into ``output``; fails the test with prepare's message if it exits non-zero."""
    status, _, err = run_prepare("prepare", *inputs, "--output", output, "--config-file", config, *extra)
    assert status == 0, err
    return output


def folder_bytes(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path to content)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
