"""Chat templates render under a loop, size, time and recursion bound (N5), with any offsets tokenizer (N11).

A template is untrusted text (it ships in a tokenizer's folder or comes from ``--chat-template``). Jinja's
sandbox keeps it from Python objects and files, not from work: nested ``range`` loops ran past 120 s at
6.8 GB, ``'x' * 10**11`` and a macro calling itself ended in ``MemoryError``/``RecursionError``
tracebacks. Each is now a ``ValueError`` naming the bound, which ``prepare`` reports on one line (exit 2).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("jinja2")

from hyper_parallel.data import chat, shards
from hyper_parallel.data.chat import MAX_RENDER_CHARS, MAX_RENDER_STEPS, ChatRenderer
from tests.support.prepared import run_prepare, tokenizer_config

MARK = "{% generation %}{{ messages[0].content }}{% endgeneration %}"
MESSAGES = [{"role": "assistant", "content": "hi"}]


class OffsetsTokenizer:
    """What a template renderer needs of a tokenizer (rendering never encodes)."""

    bos_token = eos_token = pad_token = ""

    def encode_with_offsets(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        raise NotImplementedError


HOSTILE = {
    "nested range loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        f"the chat_template ran more than {MAX_RENDER_STEPS} loop steps for one conversation",
    ),
    "a string of 10^11 characters": (
        "{{ 'x' * 10**11 }}",
        f"the chat_template builds a value of 100000000000 items (at most {MAX_RENDER_CHARS})",
    ),
    "a list doubled past the cap": (
        "{% set a = ['x'] * 10000000 %}{{ (a + a) | length }}",
        f"the chat_template builds a value of more than {MAX_RENDER_CHARS} items",
    ),
    "a huge power": ("{{ 7 ** 100000000 }}", "the chat_template computes 7 ** 100000000"),
    "output past the cap": (
        "{% for i in range(1000) %}{{ 'x' * 100000 }}{% endfor %}",
        f"the chat_template renders more than {MAX_RENDER_CHARS} characters for one conversation",
    ),
    "a macro calling itself": (
        "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
        "the chat_template recursed too deeply (a macro calling itself?)",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_template_is_a_value_error_naming_the_bound(case: str) -> None:
    template, problem = HOSTILE[case]
    renderer = ChatRenderer(OffsetsTokenizer(), template + MARK)
    with pytest.raises(ValueError, match=r"^the chat_template ") as info:
        renderer.render(MESSAGES)
    assert str(info.value).startswith(problem)


def test_loops_without_range_end_at_the_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat, "MAX_RENDER_SECONDS", 0.2)
    loops = "{% set s = 'x' * 10000 %}{% for a in s %}{% for b in s %}{% for c in s %}"
    loops += "{% endfor %}{% endfor %}{% endfor %}"
    renderer = ChatRenderer(OffsetsTokenizer(), loops + MARK)
    with pytest.raises(ValueError, match=r"^the chat_template took more than 0.2 s for one conversation$"):
        renderer.render(MESSAGES)


def test_an_ordinary_template_renders_as_before() -> None:
    renderer = ChatRenderer(
        OffsetsTokenizer(), "{% for m in messages %}<{{ m.role }}>" + MARK + "{% endfor %}"
    )
    assert renderer.render(MESSAGES) == ("<assistant>hi", [(11, 13)])


def test_a_chat_template_file_renders_with_the_byte_tokenizer(tmp_path: Path) -> None:
    # The byte tokenizer reports character offsets now (encode_with_offsets): a template is no refusal.
    data = tmp_path / "chat.jsonl"
    data.write_text(
        '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n'
    )
    template = tmp_path / "template.jinja"
    template.write_text("{{ messages[0].content }}" + MARK)
    status, _, err = run_prepare(
        "prepare",
        data,
        "--output",
        tmp_path / "out",
        "--config-file",
        tokenizer_config(tmp_path / "cfg"),
        "--format",
        "chat",
        "--chat-template",
        template,
    )
    assert status == 0, err
    (arrays,) = shards.open_prepared(tmp_path / "out").shards
    assert arrays.tokens.tolist() == [ord("a"), ord("a"), 257]  # the EOS packing appends, untrained
    assert arrays.mask.tolist() == [0, 1, 0]
