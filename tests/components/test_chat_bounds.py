"""Chat templates render under a loop, size, memory, time and recursion bound (N5, M8, M9), with any
offsets tokenizer (N11).

A template is untrusted text (it ships in a tokenizer's folder or comes from ``--chat-template``). Jinja's
sandbox keeps it from Python objects and files, not from work: nested ``range`` loops ran past 120 s at
6.8 GB, ``'x' * 10**11`` and a macro calling itself ended in ``MemoryError``/``RecursionError``
tracebacks; many values of medium size (kept in a namespace, a ``{% set %}`` block, slices, ``~``) passed
the length caps one at a time and filled the memory; a failing record was rendered twice, a ``range`` the
sandbox refuses and a ``TypeError`` were tracebacks. Each is now a ``ValueError`` naming the bound, which
``prepare`` and the ``chat`` source report on one line at the record (exit 2), each record rendered once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("jinja2")

from hyper_parallel.data import chat, shards
from hyper_parallel.data.chat import (
    MAX_RENDER_BYTES,
    MAX_RENDER_CHARS,
    MAX_RENDER_STEPS,
    ChatRenderer,
)
from tests.support.chat_data import write_chats
from tests.support.prepared import prepare_in_child, run_prepare, tokenizer_config

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
    # M9: jinja's own refusal was an OverflowError traceback
    "a range the sandbox refuses": (
        "{% for i in range(10**30) %}{% endfor %}",
        "the chat_template asks for a range of more than 100000 steps",
    ),
    # M8: one value past the cap, through the operations that were not checked
    "a concatenation with ~": (
        "{% set s = 'x' * 16000000 %}{{ (s ~ s) | length }}",
        f"the chat_template builds a concatenated text of 32000000 items (at most {MAX_RENDER_CHARS})",
    ),
    "a join": (
        "{% set s = 'x' * 1000000 %}{{ ([s] * 10000) | join | length }}",
        "the chat_template builds a joined text of 17000000 items",
    ),
    "a replace": (
        "{% set s = 'x' * 100000 %}{{ s | replace('x', s) | length }}",
        "the chat_template builds a replaced text of 10000000000 items",
    ),
    "a centred text": (
        "{{ 'x' | center(10**10) }}",
        "the chat_template builds a centred text of 10000000000",
    ),
    "a padded text": ("{{ 'x'.ljust(10**10) }}", "the chat_template builds a padded text of 10000000000"),
    "a format": ("{{ '%10000000000s' | format('x') }}", "the chat_template builds a formatted string of"),
    "a % format": ("{{ '%10000000000s' % 'x' }}", "the chat_template builds a formatted string of"),
    "a list written out": (
        "{% set a = ['x' * 1000000] * 10000 %}{{ a }}",
        "the chat_template builds the text of a value of 20020006 items",
    ),
    "a product of large integers": (
        "{% set ns = namespace(n=10**64) %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
        "the chat_template computes a product of more than 8192 bits",
    ),
    # M8: many values each within the cap, whose sum was not bounded
    "medium strings kept in a loop": (
        "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}"
        "{% set ns.l = ns.l + ['x' * 10000000 ~ i] %}{% endfor %}",
        f"the chat_template built more than {MAX_RENDER_BYTES} bytes of values for one conversation",
    ),
    "slices kept in a loop": (
        "{% set s = 'x' * 16000000 %}{% set ns = namespace(l=[]) %}{% for i in range(1000) %}"
        "{% set ns.l = ns.l + [s[i:]] %}{% endfor %}",
        f"the chat_template built more than {MAX_RENDER_BYTES} bytes of values for one conversation",
    ),
    "a block's output": (
        "{% set b %}{% for i in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}{% endset %}",
        f"the chat_template built more than {MAX_RENDER_BYTES} bytes of values for one conversation",
    ),
    # the time limit cannot interrupt a comparison Python makes in C: 12 million items of 16 MB, hours
    "two lists of long equal strings compared": (
        "{% set a = ['x' * 16000000] * 12000000 %}{% set b = ['x' * 16000000] * 12000000 %}{{ a == b }}",
        f"the chat_template compares a value of more than {MAX_RENDER_CHARS} characters of text",
    ),
    "a text cut into millions of parts": (
        "{% set s = '\u4e00 ' * 8000000 %}{{ s.split(' ') | length }}",
        f"the chat_template would build more than {MAX_RENDER_BYTES} bytes of values for one conversation "
        "(the parts of split)",
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


def test_ordinary_operations_render_as_jinja_renders_them() -> None:
    # Every operation the sandbox now checks gives jinja's own result when it fits.
    template = (
        "{{ '%s-%d' % ('x', 3) ~ ('ab' * 3)[1:4] ~ ('a,b,c'.split(',') | join('|')) }}"
        "{{ '{}:{}'.format(1, 'z') }}"
        "{{ 'x' | center(5) }}{{ 'q\nr' | indent(2) }}{{ 'ab' | replace('a', 'AA') }}{{ [1, 2, 3][::-1] }}"
        "{{ {'a': [1, '<b>']} | tojson }}{% set b %}{% for i in range(3) %}{{ i }}{% endfor %}{% endset %}"
        "{{ b }}{{ 2 ** 10 }}{{ [[1], [2]] | sum(start=[]) }}{{ 1 < 2 < 3 }}{{ 'a' in ['a'] }}"
        "{{ [1] == [1] }}{{ 2 is in [2] }}{{ [2, 1] | sort | first }}"
    )
    renderer = ChatRenderer(OffsetsTokenizer(), template + MARK)
    text, _ = renderer.render(MESSAGES)
    assert text == (
        'x-3baba|b|c1:z  x  q\n  rAAb[3, 2, 1]{"a": [1, "\\u003cb\\u003e"]}0121024[1, 2]TrueTrueTrueTrue1hi'
    )


def _chat_file(tmp_path: Path, contents: list[str]) -> Path:
    """One conversation a record: the user's ``q``, then each of ``contents`` as the assistant's answer."""
    chats = [[{"role": "user", "content": "q"}, {"role": "assistant", "content": c}] for c in contents]
    return write_chats(tmp_path / "chat.jsonl", chats)


def _prepare_argv(tmp_path: Path, template: str, data: Path, *extra: str) -> list[str | Path]:
    """``prepare``'s arguments for ``data`` with ``template`` as the chat template (written to a file)."""
    path = tmp_path / "template.jinja"
    path.write_text(template)
    config = tokenizer_config(tmp_path / "cfg")
    return [
        "prepare",
        data,
        "--output",
        tmp_path / "out",
        "--config-file",
        config,
        "--format",
        "chat",
        "--chat-template",
        path,
        *extra,
    ]


def _prepare_chat(tmp_path: Path, template: str, data: Path, *extra: str) -> tuple[int, str]:
    status, _, err = run_prepare(*_prepare_argv(tmp_path, template, data, *extra))
    return status, err


def test_a_chat_template_file_renders_with_the_byte_tokenizer(tmp_path: Path) -> None:
    # The byte tokenizer reports character offsets now (encode_with_offsets): a template is no refusal.
    status, err = _prepare_chat(tmp_path, "{{ messages[0].content }}" + MARK, _chat_file(tmp_path, ["b"]))
    assert status == 0, err
    (arrays,) = shards.open_prepared(tmp_path / "out").shards
    assert arrays.tokens.tolist() == [ord("q"), ord("q"), 257]  # the EOS packing appends, untrained
    assert arrays.mask.tolist() == [0, 1, 0]


REFUSALS = {
    "TypeError": (
        "{{ 'a' + 1 }}",
        'the chat_template failed: TypeError: can only concatenate str (not "int") to str',
    ),
    "ZeroDivisionError": ("{{ 1 / 0 }}", "the chat_template failed: ZeroDivisionError: division by zero"),
    "SecurityError": (
        "{{ ''.__class__.__name__ }}",
        "the chat_template failed: access to attribute '__class__' of 'str' object is unsafe.",
    ),
    "OverflowError": (
        "{{ range(10**30) | list }}",
        "the chat_template asks for a range of more than 100000 steps",
    ),
    "RecursionError": (
        "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
        "the chat_template recursed too deeply (a macro calling itself?)",
    ),
    "a message of several lines": (
        "{{ raise_exception('no\nsystem message') }}",
        "the chat_template failed: no system message",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_every_sandbox_refusal_is_one_line_at_the_record_with_exit_2(tmp_path: Path, case: str) -> None:
    template, problem = REFUSALS[case]
    data = _chat_file(tmp_path, ["fine", "boom"])
    guarded = "{% if messages[1].content == 'boom' %}" + template + "{% endif %}"
    status, err = _prepare_chat(tmp_path, guarded + MARK.replace("[0]", "[1]"), data)
    assert (status, err) == (2, f"{data}:2: {problem}\n")


def test_the_chat_source_reports_a_refusal_at_the_record_at_launch(tmp_path: Path) -> None:
    from hyper_parallel.components.dataloader._chat import chat_shards
    from hyper_parallel.components.dataloader.sources import ChatSource
    from hyper_parallel.components.tokenizer import ByteTokenizer
    from hyper_parallel.errors import InputFileError

    data = _chat_file(tmp_path, ["fine", "boom"])
    template = tmp_path / "template.jinja"
    template.write_text(
        "{% if messages[1].content == 'boom' %}{% for i in range(10**30) %}{% endfor %}{% endif %}"
        + MARK.replace("[0]", "[1]")
    )
    tokenizer = ByteTokenizer.Config(chat_template=str(template)).build()
    with pytest.raises(InputFileError) as info:
        chat_shards(ChatSource(paths=(str(data),)), tokenizer)
    assert str(info.value) == f"{data}:2: the chat_template asks for a range of more than 100000 steps"


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the renderings (``_generate``) and the time limits (``_time_limit``) entered."""
    counts = {"renderings": 0, "limits": 0}
    generate, limit = ChatRenderer._generate, chat._time_limit

    def counted_generate(self: ChatRenderer, *args: Any) -> str:
        counts["renderings"] += 1
        return generate(self, *args)

    def counted_limit(seconds: float) -> Any:
        counts["limits"] += 1
        return limit(seconds)

    monkeypatch.setattr(ChatRenderer, "_generate", counted_generate)
    monkeypatch.setattr(chat, "_time_limit", counted_limit)
    return counts


def test_a_failing_record_is_rendered_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The batch was rendered, and on a failure each record again to find it: a 10 s limit took 20 s.
    counts = _counting(monkeypatch)
    data = _chat_file(tmp_path, ["fine", "boom", "never read"])
    template = "{% if messages[1].content == 'boom' %}{{ raise_exception('boom') }}{% endif %}"
    status, err = _prepare_chat(tmp_path, template + MARK.replace("[0]", "[1]"), data)
    assert (status, err) == (2, f"{data}:2: the chat_template failed: boom\n")
    assert counts == {"renderings": 2, "limits": 2}


def test_one_time_limit_covers_both_renderings_of_a_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Training on user turns renders each record twice (marked, then plain): one limit covers both.
    counts = _counting(monkeypatch)
    data = _chat_file(tmp_path, ["a", "b", "c"])
    template = (
        "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% else %}"
        + MARK
        + "{% endif %}{% endfor %}"
    )
    template = template.replace("messages[0].content", "m.content")
    status, err = _prepare_chat(tmp_path, template, data, "--train-on", "user,assistant")
    assert status == 0, err
    assert counts == {"renderings": 6, "limits": 3}


MEMORY = {
    "medium strings kept in a loop": HOSTILE["medium strings kept in a loop"][0],
    "lists kept in a loop": (
        "{% set ns = namespace(l=[]) %}{% for i in range(100) %}{% set ns.l = ns.l + [[i] * 16000000] %}"
        "{% endfor %}"
    ),
    "a block's output": HOSTILE["a block's output"][0],
}


@pytest.mark.multiprocess  # prepare runs in a child, whose peak memory is read
@pytest.mark.parametrize("case", list(MEMORY))
def test_a_template_that_builds_gigabytes_from_a_tiny_record_is_refused_under_1_5_gb(
    tmp_path: Path, case: str
) -> None:
    # Each filled the 4 GiB the child may map (6.7 GB, then an abort, without a limit).
    data = _chat_file(tmp_path, ["hi"])
    status, err, peak = prepare_in_child(
        *_prepare_argv(tmp_path, MEMORY[case] + MARK.replace("[0]", "[1]"), data)
    )
    assert (status, err.count("\n")) == (2, 1), err
    assert err.startswith(f"{data}:1: the chat_template built more than {MAX_RENDER_BYTES} bytes"), err
    assert peak < 1.5 * (1 << 30), peak
