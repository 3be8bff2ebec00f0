"""Shared by the prepared-data tests: configs naming a tokenizer, and ``prepare`` run in this process."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from hyper_parallel.data.__main__ import main
from tests.support.peak_rss import OWN_PEAK_KIB

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


#: The address space a ``prepare_in_child`` child may map: a run that would take more fails there (exit
#: 1 or an abort), never the machine.
CHILD_ADDRESS_SPACE = 4 << 30

_CHILD = (
    OWN_PEAK_KIB
    + """
import io, json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
from hyper_parallel.data.__main__ import main
out, err = io.StringIO(), io.StringIO()
status = main(sys.argv[2:], out=out, err=err)
peak = own_peak_kib() * 1024
print(json.dumps({"status": status, "err": err.getvalue(), "peak": peak}))
"""
)


def prepare_in_child(*args: str | Path, threads: int = 2) -> tuple[int, str, int]:
    """``python -m hyper_parallel.data ARGS`` in a child process under ``CHILD_ADDRESS_SPACE``: (exit
    status, stderr, the child's peak resident set in bytes, its ``ru_maxrss``). ``threads``: the Rust
    tokenizer's (as on a machine with that many cores). A child that dies (an allocation the limit refuses
    aborts the Rust tokenizer) fails the test with its output."""
    env = dict(os.environ, OMP_NUM_THREADS="1", RAYON_NUM_THREADS=str(threads))
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(CHILD_ADDRESS_SPACE), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, f"the child ended with {done.returncode}: {done.stderr[-2000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return int(report["status"]), str(report["err"]), int(report["peak"])
