"""Chat records to token ids and an assistant mask: the loss is taken on the assistant turns only.

A tokenizer with a ``chat_template`` (the Jinja template of a Hugging Face ``tokenizer_config.json``) renders
each conversation with it, in a sandbox (``jinja2.sandbox.ImmutableSandboxedEnvironment``: a template cannot
reach Python objects or files). The assistant tokens are those the template marks with
``{% generation %} ... {% endgeneration %}``, the convention Hugging Face's
``apply_chat_template(..., return_assistant_tokens_mask=True)`` reads: a token is trained on when its
characters overlap a marked span. The text is encoded without adding bos/eos (the template writes its own
special tokens), as ``apply_chat_template`` does. A template without ``generation`` marks is refused:
nothing would be trained on.

A tokenizer without a template (the byte tokenizer) uses the built-in one, documented here because it is a
format: ``[bos]`` (when the tokenizer adds one), then for each message ``<|ROLE|>`` and a newline (not
trained on), then its content; a non-assistant content is followed by a newline, an assistant content by
the EOS id, and the assistant content and that EOS are what is trained on. A content that is a list of
parts (``image_chat`` data) writes them in order, an image as its placeholder ids (never trained on).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = ["MAX_RENDER_CHARS", "MAX_RENDER_SECONDS", "MAX_RENDER_STEPS", "ChatRenderer", "builtin_chat"]

_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use characters marking generation spans while rendering

#: Most characters one conversation may render to (the template's output, and any string or list an
#: expression builds on the way: ``'x' * 10**11`` is refused before it is built).
MAX_RENDER_CHARS = 16 << 20
#: Most iterations of ``range`` loops in one rendering (nested loops over ``range(100000)``).
MAX_RENDER_STEPS = 1_000_000
#: Most seconds one rendering may take (in a main thread, where a timer can interrupt it).
MAX_RENDER_SECONDS = 10.0


class _Budget:
    """What one rendering has spent: ``range`` steps; reset before each rendering."""

    def __init__(self) -> None:
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_RENDER_STEPS:
            raise ValueError(
                f"the chat_template ran more than {MAX_RENDER_STEPS} loop steps for one conversation"
            )


class _Timeout(Exception):
    """Raised by the rendering timer."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Interrupt the block after ``seconds`` (a ``SIGALRM`` timer; only in a process's main thread)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _size(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else None


def _checked_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse an operation whose result would exceed ``MAX_RENDER_CHARS`` before it is computed."""
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            size = _size(seq)
            if size is not None and isinstance(times, int) and size * times > MAX_RENDER_CHARS:
                raise ValueError(
                    f"the chat_template builds a value of {size * times} items (at most {MAX_RENDER_CHARS})"
                )
    elif operator == "+":
        sizes = (_size(left), _size(right))
        if None not in sizes and sum(sizes) > MAX_RENDER_CHARS:  # type: ignore[arg-type]
            raise ValueError(f"the chat_template builds a value of more than {MAX_RENDER_CHARS} items")
    elif (
        operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 64
    ):
        raise ValueError(f"the chat_template computes {left} ** {right}, a number too large to need")


def builtin_chat(
    tokenizer: Any, messages: Sequence[Mapping[str, str | Sequence[str | Sequence[int]]]]
) -> tuple[list[int], list[int]]:
    """Ids and assistant mask of ``messages`` under the built-in template (the module docstring).

    A content may also be a list of parts, written in order: text, or a list of ids put in as they are
    and never trained on (an image's placeholder ids, ``image_chat`` data)."""
    ids: list[int] = []
    mask: list[int] = []
    bos, eos = getattr(tokenizer, "bos_id", None), getattr(tokenizer, "eos_id", None)
    if bos is not None and getattr(tokenizer, "add_bos", False):
        ids.append(bos)
        mask.append(0)

    def add(text: str, trained: int) -> None:
        piece = tokenizer.encode(text, add_bos=False, add_eos=False)
        ids.extend(piece)
        mask.extend([trained] * len(piece))

    for message in messages:
        assistant = message["role"] == "assistant"
        add(f"<|{message['role']}|>\n", 0)
        content = message["content"]
        if isinstance(content, str):
            add(content if assistant else content + "\n", int(assistant))
        else:
            for part in content:
                if isinstance(part, str):
                    add(part, int(assistant))
                else:
                    ids.extend(part)
                    mask.extend([0] * len(part))
            if not assistant:
                add("\n", 0)
        if assistant and eos is not None:
            ids.append(eos)
            mask.append(1)
    return ids, mask


class ChatRenderer:
    """Encodes conversations with the tokenizer's chat template, or the built-in one when it has none.

    ``template`` (Jinja text) replaces the tokenizer's own when given. Refused at construction (a
    ``ValueError`` naming the reason): a template that does not parse, or has no ``generation`` marks.
    """

    def __init__(self, tokenizer: Any, template: str | None = None) -> None:
        self.tokenizer = tokenizer
        source = template if template is not None else getattr(tokenizer, "chat_template", None)
        self.template_text: str | None = source
        self._template: Any = None
        self._budget = _Budget()
        if source is None:
            return
        if not hasattr(tokenizer, "encode_with_offsets"):
            raise ValueError(
                "a chat template needs a tokenizer that reports character offsets (a Hugging Face "
                f"tokenizer); {type(tokenizer).__name__} uses the built-in chat format: leave "
                "--chat-template out"
            )
        if "generation" not in source:
            raise ValueError(
                "the tokenizer's chat_template has no {% generation %} marks, so no assistant token would be "
                "trained on: add them around the assistant content"
            )
        import jinja2
        import jinja2.ext
        import jinja2.sandbox

        class _Generation(jinja2.ext.Extension):
            tags = {"generation"}

            def parse(self, parser: Any) -> Any:
                line = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return jinja2.nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(line)

            def _mark(self, caller: Any) -> str:
                return f"{_OPEN}{caller()}{_CLOSE}"

        def _raise(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        class _Bounded(jinja2.sandbox.ImmutableSandboxedEnvironment):
            """The sandbox, with the operators that grow values checked first (``_checked_binop``)."""

            intercepted_binops = frozenset({"*", "+", "**"})

            def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
                _checked_binop(operator, left, right)
                return super().call_binop(context, operator, left, right)

        budget = self._budget

        def _range(*args: int) -> Iterator[int]:
            for value in jinja2.sandbox.safe_range(*args):
                budget.step()
                yield value

        environment = _Bounded(
            trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
        )
        environment.globals["raise_exception"] = _raise
        environment.globals["range"] = _range
        try:
            self._template = environment.from_string(source)
        except jinja2.exceptions.TemplateError as exc:
            raise ValueError(f"the chat_template does not parse: {exc}") from None

    def render(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = False
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and its assistant character spans ``[start, end)`` (template tokenizers only);
        ``add_generation_prompt`` ends it with the assistant's header (a prompt to answer)."""
        import jinja2

        assert self._template is not None
        tok = self.tokenizer
        for message in messages:
            if _OPEN in message["content"] or _CLOSE in message["content"]:
                raise ValueError("a message holds the private-use characters U+E000/U+E001")
        self._budget.steps = 0
        chunks: list[str] = []
        size = 0
        try:
            with _time_limit(MAX_RENDER_SECONDS):
                for chunk in self._template.generate(
                    messages=list(messages),
                    add_generation_prompt=add_generation_prompt,
                    bos_token=getattr(tok, "bos_token", None) or "",
                    eos_token=getattr(tok, "eos_token", None) or "",
                    pad_token=getattr(tok, "pad_token", None) or "",
                ):
                    size += len(chunk)
                    if size > MAX_RENDER_CHARS:
                        raise ValueError(
                            f"the chat_template renders more than {MAX_RENDER_CHARS} characters for one "
                            "conversation"
                        )
                    chunks.append(chunk)
        except jinja2.exceptions.TemplateError as exc:
            raise ValueError(f"the chat_template failed: {exc}") from None
        except _Timeout:
            raise ValueError(
                f"the chat_template took more than {MAX_RENDER_SECONDS:g} s for one conversation"
            ) from None
        except RecursionError:
            raise ValueError("the chat_template recursed too deeply (a macro calling itself?)") from None
        except MemoryError:
            raise ValueError("the chat_template ran out of memory rendering one conversation") from None
        marked = "".join(chunks)
        text: list[str] = []
        spans: list[tuple[int, int]] = []
        length = 0
        start = 0
        for char in marked:
            if char == _OPEN:
                start = length
            elif char == _CLOSE:
                spans.append((start, length))
            else:
                text.append(char)
                length += 1
        return "".join(text), spans

    def encode_batch(
        self, conversations: Sequence[Sequence[dict[str, str]]]
    ) -> list[tuple[list[int], list[int]]]:
        """``(ids, assistant mask)`` of each conversation."""
        if self._template is None:
            return [builtin_chat(self.tokenizer, messages) for messages in conversations]
        rendered = [self.render(messages) for messages in conversations]
        encodings = self.tokenizer.encode_with_offsets([text for text, _ in rendered])
        out = []
        for (_, spans), (ids, offsets) in zip(rendered, encodings, strict=True):
            mask = [0] * len(ids)
            span = 0
            for index, (begin, end) in enumerate(offsets):
                while span < len(spans) and begin >= spans[span][1]:
                    span += 1
                if span == len(spans):
                    break
                if end > spans[span][0]:
                    mask[index] = 1
            out.append((ids, mask))
        return out
