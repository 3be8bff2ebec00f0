"""``prepare``'s option values and its template file: each wrong one is one line and exit 2, before a
tokenizer is built or an input read (no traceback from ``int(inf)``, a binary's bytes or a FIFO's wait)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from hyper_parallel.data.__main__ import main

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "llama3_debug.yaml"


def _prepare(tmp_path: Path, *flags: str) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    argv = [
        "prepare",
        str(tmp_path / "in.jsonl"),
        "--output",
        str(tmp_path / "out"),
        "--config-file",
        str(CONFIG),
    ]
    status = main([*argv, *flags], err=err, out=out)
    assert out.getvalue() == ""
    return status, err.getvalue()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nan", "--shard-mb: must be positive, got nan"),
        ("inf", "--shard-mb: must be at most 1048576 (1 TiB), got inf"),
        ("1e300", "--shard-mb: must be at most 1048576 (1 TiB), got 1e+300"),
    ],
)
def test_a_shard_size_that_is_no_byte_count_is_one_line(tmp_path: Path, value: str, message: str) -> None:
    assert _prepare(tmp_path, "--shard-mb", value) == (2, message + "\n")
    assert not (tmp_path / "out").exists()


def test_a_program_as_the_chat_template_is_one_line(tmp_path: Path) -> None:
    binary = tmp_path / "ls"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    status, err = _prepare(tmp_path, "--format", "chat", "--chat-template", str(binary))
    problem = "not UTF-8 text (byte 0x80 at 136): a chat template is a Jinja text file"
    assert (status, err) == (2, f"--chat-template: {binary}: {problem}\n")


@pytest.mark.parametrize("kind", ["fifo", "folder", "huge"])
def test_a_chat_template_that_is_no_text_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    template = tmp_path / "template.jinja"
    if kind == "fifo":
        os.mkfifo(template)  # no writer: opening it to read would wait forever
        problem = "is a FIFO, not a regular file: give a file (it would be waited on or read forever)"
    elif kind == "folder":
        template.mkdir()
        problem = "is a folder, not a file"
    else:
        template.write_bytes(b"{# #}" * (1 << 18))
        problem = "larger than 1,048,576 bytes: a chat template is a Jinja text file"
    status, err = _prepare(tmp_path, "--format", "chat", "--chat-template", str(template))
    assert (status, err) == (2, f"--chat-template: {template}: {problem}\n")
