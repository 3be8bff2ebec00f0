"""Chat records to token ids and a label mask: the loss is taken on the turns of the roles ``train_on`` names.

A chat record has one of three shapes, told apart per record (``conversation``): OpenAI's ``{"messages":
[{"role", "content"}, ...]}``, ShareGPT's ``{"conversations": [{"from", "value"}, ...]}`` and Alpaca's
``{"instruction", "input", "output"}`` (the instruction, and the input after a blank line when there is
one, is the user's message; the output is the assistant's). Roles are read as written (``ROLES``:
system, user, assistant, tool); ShareGPT's ``human`` and ``gpt`` are read as user and assistant (its
``system``, and the roles as written, as themselves, as Axolotl's ShareGPT reading does). Any other role
is refused: a role a template does not know is rendered as nothing, or as a wrong turn, without a word.

A tokenizer with a ``chat_template`` (the Jinja template of a Hugging Face ``tokenizer_config.json``) renders
each conversation with it, in a sandbox (``jinja2.sandbox.ImmutableSandboxedEnvironment``: a template cannot
reach Python objects or files), bounded in memory and work by ``_sandbox`` (each value it builds, all it
builds, loop steps; the time limit covers a record's whole rendering; every exception a template raises is
a one-line ``ValueError`` starting ``the chat_template``). The assistant tokens are those the template
marks with ``{% generation %} ... {% endgeneration %}``, the convention Hugging Face's
``apply_chat_template(..., return_assistant_tokens_mask=True)`` reads: a token is trained on when its
characters overlap a marked span. The text is encoded without adding bos/eos (the template writes its own
special tokens), as ``apply_chat_template`` does. The marks are found in the parsed template (a
``generation`` block in its syntax tree), not in its text: Hugging Face templates without marks (ChatML,
Llama 3, Qwen) all hold the word in ``add_generation_prompt``. A template without a ``generation`` block
is refused while ``assistant`` is trained on: nothing would be. The content of a message of another role
``train_on`` names (``user``, ``system``, ``tool``) is marked by itself: it is given to the template
between two private-use characters (inside its leading and trailing whitespace, which templates trim),
and the conversation is rendered a second time unmarked; when the two texts differ once the marks are
taken out, the template changes that content (cuts or tests it) and the conversation is refused, since
its tokens could not be found exactly.

A tokenizer without a template (the byte tokenizer) uses the built-in one, documented here because it is a
format: ``[bos]`` (when the tokenizer adds one), then for each message ``<|ROLE|>`` and a newline (never
trained on), then its content; a non-assistant content is followed by a newline, an assistant content by
the EOS id. A message whose role is in ``train_on`` has what follows its header trained on: an
assistant's content and its EOS, another role's content and its newline (encoded as one text, so the
ids are those of the format whatever is trained). A content that is a list of parts (``image_chat``
data) writes them in order, an image as its placeholder ids (never trained on).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hyper_parallel.data._sandbox import (
    MAX_RENDER_BYTES,
    MAX_RENDER_CHARS,
    MAX_RENDER_STEPS,
    Budget,
    TemplateRefusal,
    bounded_environment,
    compare_values,
    join_values,
    rewrite_tree,
    slice_value,
)
from hyper_parallel.errors import TextTooLong

__all__ = [
    "MAX_RENDER_BYTES",
    "MAX_RENDER_CHARS",
    "MAX_RENDER_SECONDS",
    "MAX_RENDER_STEPS",
    "ROLES",
    "ChatRenderer",
    "ConversationError",
    "builtin_chat",
    "conversation",
    "train_on_problem",
]

_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use characters marking generation spans while rendering
_IN, _OUT = "\ue002", "\ue003"  # ... and the content of a trained message of a role other than assistant
_MARKS = (_OPEN, _CLOSE, _IN, _OUT)

#: The roles of a message, as written.
ROLES = ("system", "user", "assistant", "tool")
#: The role values of each shape of record and the roles they are read as (OpenAI's as written).
_OPENAI = {role: role for role in ROLES}
_SHAREGPT = {"human": "user", "gpt": "assistant", **_OPENAI}
_SHAPES = (
    "'messages' (OpenAI: role/content), 'conversations' (ShareGPT: from/value) or "
    "'instruction'/'input'/'output' (Alpaca)"
)

#: Most seconds one conversation's rendering may take, both renderings when a role other than assistant is
#: trained on (in a main thread, where a timer can interrupt it).
MAX_RENDER_SECONDS = 10.0


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


def _one_line(exc: BaseException) -> str:
    """An exception's text on one line, cut to 300 characters (a template's ``raise_exception`` text is
    the template's to choose)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else f"{text[:300]}... ({len(text)} characters)"


def train_on_problem(train_on: Sequence[str]) -> str | None:
    """What makes ``train_on`` (the roles whose turns are trained on) unusable, or None."""
    if not train_on:
        return f"names no role: give one or more of {', '.join(ROLES)}"
    unknown = [role for role in train_on if role not in ROLES]
    if unknown:
        return f"{unknown[0]!r} is not a role: the roles are {', '.join(ROLES)}"
    return None


def conversation(record: Mapping[str, Any]) -> list[dict[str, str]]:
    """The messages (``role``, ``content``) of one chat record, whichever of the three shapes it has.

    Raises ``ValueError`` saying what is wrong (the caller adds where)."""
    if "messages" in record:
        return _messages(record["messages"], "messages", "role", "content", _OPENAI)
    if "conversations" in record:
        return _messages(record["conversations"], "conversations", "from", "value", _SHAREGPT)
    if "instruction" in record or "output" in record:
        instruction, given, output = record.get("instruction"), record.get("input"), record.get("output")
        given = "" if given is None else given
        if not (isinstance(instruction, str) and isinstance(given, str) and isinstance(output, str)):
            raise ValueError(
                "an Alpaca record needs string 'instruction' and 'output' ('input': a string or absent)"
            )
        user = f"{instruction}\n\n{given}" if given else instruction
        return [{"role": "user", "content": user}, {"role": "assistant", "content": output}]
    raise ValueError(f"not a chat record: expected {_SHAPES}")


def _messages(
    raw: object, key: str, role_key: str, text_key: str, roles: Mapping[str, str]
) -> list[dict[str, str]]:
    """A list of messages with ``role_key`` and ``text_key``, each role read through ``roles``."""
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"no {key!r} list")
    out = []
    for i, message in enumerate(raw):
        if (
            not isinstance(message, dict)
            or not isinstance(message.get(role_key), str)
            or not isinstance(message.get(text_key), str)
        ):
            raise ValueError(f"{key}[{i}] is not an object with string {role_key!r} and {text_key!r}")
        role = roles.get(message[role_key])
        if role is None:
            raise ValueError(
                f"{key}[{i}] has {role_key} {message[role_key][:40]!r}, not one of {', '.join(roles)}"
            )
        out.append({"role": role, "content": message[text_key]})
    return out


def builtin_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, str | Sequence[str | Sequence[int]]]],
    train_on: Sequence[str] = ("assistant",),
) -> tuple[list[int], list[int]]:
    """Ids and label mask of ``messages`` under the built-in template (the module docstring).

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
        trained = int(message["role"] in train_on)
        add(f"<|{message['role']}|>\n", 0)
        content = message["content"]
        if isinstance(content, str):
            add(content if assistant else content + "\n", trained)
        else:
            for part in content:
                if isinstance(part, str):
                    add(part, trained)
                else:
                    ids.extend(part)
                    mask.extend([0] * len(part))
            if not assistant:
                add("\n", trained)
        if assistant and eos is not None:
            ids.append(eos)
            mask.append(trained)
    return ids, mask


class ConversationError(ValueError):
    """A conversation of a batch the template cannot render (``index``: where in the batch), so that the
    caller names its record without rendering it again."""

    def __init__(self, index: int, problem: str) -> None:
        super().__init__(problem)
        self.index = index


class ChatRenderer:
    """Encodes conversations with the tokenizer's chat template, or the built-in one when it has none.

    ``template`` (Jinja text) replaces the tokenizer's own when given; ``train_on`` names the roles whose
    turns carry labels (the module docstring). Refused at construction (a ``ValueError`` naming the
    reason): a template that does not parse, or has no ``generation`` block while ``assistant`` is
    trained on.
    """

    def __init__(
        self, tokenizer: Any, template: str | None = None, train_on: Sequence[str] = ("assistant",)
    ) -> None:
        self.tokenizer = tokenizer
        source = template if template is not None else getattr(tokenizer, "chat_template", None)
        self.template_text: str | None = source
        self.train_on = tuple(train_on)
        self._template: Any = None
        self._budget = Budget()
        if source is None:
            return
        if not hasattr(tokenizer, "encode_with_offsets"):
            raise ValueError(
                "a chat template needs a tokenizer that reports character offsets (a Hugging Face "
                f"tokenizer); {type(tokenizer).__name__} uses the built-in chat format: leave "
                "--chat-template out"
            )
        import jinja2
        import jinja2.ext

        budget = self._budget

        class _Generation(jinja2.ext.Extension):
            tags = {"generation"}

            def parse(self, parser: Any) -> Any:
                line = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return jinja2.nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(line)

            def _mark(self, caller: Any) -> str:
                return f"{_OPEN}{caller()}{_CLOSE}"

            def _join(self, *values: Any) -> str:
                return join_values(budget, *values)

            def _compare(self, *args: Any) -> bool:
                return compare_values(*args)

            def _slice(self, value: Any, start: Any, stop: Any, step: Any) -> Any:
                return slice_value(budget, value, start, stop, step)

        def _raise(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        environment = bounded_environment(budget, [_Generation])
        environment.globals["raise_exception"] = _raise
        extension = environment.extensions[_Generation.identifier]
        try:
            tree = rewrite_tree(environment.parse(source), extension.attr)
        except jinja2.exceptions.TemplateError as exc:
            raise ValueError(f"the chat_template does not parse: {exc}") from None
        # A generation block is a call of the extension's ``_mark`` in the tree (``_Generation.parse``).
        marked = any(
            node.identifier == _Generation.identifier and node.name == "_mark"
            for node in tree.find_all(jinja2.nodes.ExtensionAttribute)
        )
        if not marked and "assistant" in self.train_on:
            raise ValueError(
                "the tokenizer's chat_template has no {% generation %} marks, so no assistant token would be "
                "trained on: add them around the assistant content"
            )
        try:
            self._template = environment.from_string(tree)
        except jinja2.exceptions.TemplateError as exc:
            raise ValueError(f"the chat_template does not parse: {exc}") from None

    def render(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = False
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and its trained character spans ``[start, end)`` (template tokenizers only):
        the ``generation`` blocks when ``assistant`` is trained on, and the content of the messages of
        the other roles ``train_on`` names; ``add_generation_prompt`` ends it with the assistant's header
        (a prompt to answer)."""
        for message in messages:
            if any(mark in message["content"] for mark in _MARKS):
                raise ValueError("a message holds one of the private-use characters U+E000 to U+E003")
        import jinja2

        self._budget.reset()
        try:
            with _time_limit(MAX_RENDER_SECONDS):
                return self._render(messages, add_generation_prompt)
        except TemplateRefusal:
            raise
        except _Timeout:
            raise TemplateRefusal(
                f"the chat_template took more than {MAX_RENDER_SECONDS:g} s for one conversation"
            ) from None
        except jinja2.exceptions.TemplateError as exc:
            raise TemplateRefusal(f"the chat_template failed: {_one_line(exc)}") from None
        except RecursionError:
            raise TemplateRefusal("the chat_template recursed too deeply (a macro calling itself?)") from None
        except MemoryError:
            raise TemplateRefusal("the chat_template ran out of memory rendering one conversation") from None
        except Exception as exc:  # anything else a template's expression raises: 1 / 0, 'a' + 1, ...
            raise TemplateRefusal(
                f"the chat_template failed: {type(exc).__name__}: {_one_line(exc)}"
            ) from None

    def _render(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool
    ) -> tuple[str, list[tuple[int, int]]]:
        """``render`` inside its time limit and budget: once, or twice when the content of a role other
        than assistant is marked (the second rendering, unmarked, checks the template writes it as given)."""
        own = [role for role in self.train_on if role != "assistant"]
        marked = [_content_marked(message) if message["role"] in own else message for message in messages]
        text, spans, paired = _spans(
            self._generate(marked, add_generation_prompt), "assistant" in self.train_on
        )
        if marked != list(messages):
            plain, _, _ = _spans(self._generate(messages, add_generation_prompt), False)
            if plain != text or not paired:
                roles = sorted({m["role"] for m in messages if m["role"] in own})
                raise TemplateRefusal(
                    f"the chat_template does not write the content of {'/'.join(roles)} messages as given "
                    "(it cuts or tests it), so its tokens cannot be found exactly: leave "
                    f"{'/'.join(roles)} out of train_on with this template"
                )
        return text, spans

    def _generate(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool) -> str:
        """The template's output for ``messages``, generation blocks between ``_OPEN`` and ``_CLOSE``."""
        assert self._template is not None
        tok = self.tokenizer
        chunks: list[str] = []
        size = 0
        for chunk in self._template.generate(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=getattr(tok, "bos_token", None) or "",
            eos_token=getattr(tok, "eos_token", None) or "",
            pad_token=getattr(tok, "pad_token", None) or "",
        ):
            size += len(chunk)
            if size > MAX_RENDER_CHARS:
                raise TemplateRefusal(
                    f"the chat_template renders more than {MAX_RENDER_CHARS} characters for one conversation"
                )
            chunks.append(chunk)
        return "".join(chunks)

    def encode_batch(
        self, conversations: Sequence[Sequence[dict[str, str]]]
    ) -> list[tuple[list[int], list[int]]]:
        """``(ids, label mask)`` of each conversation; one that cannot be rendered (or encoded) is a
        ``ConversationError`` naming its index, each conversation rendered once."""
        if self._template is None:
            return [builtin_chat(self.tokenizer, messages, self.train_on) for messages in conversations]
        rendered = []
        for index, messages in enumerate(conversations):
            try:
                rendered.append(self.render(messages))
            except ValueError as exc:
                raise ConversationError(index, str(exc)) from None
        try:
            encodings = self.tokenizer.encode_with_offsets([text for text, _ in rendered])
        except TextTooLong as exc:  # (the tokenizer's text_problem)
            raise ConversationError(exc.index, f"its rendering: {exc}") from None
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


def _content_marked(message: dict[str, str]) -> dict[str, str]:
    """``message`` with its content between ``_IN`` and ``_OUT``, inside its surrounding whitespace (which
    templates trim: the marks stay at the content's ends)."""
    content = message["content"]
    core = content.strip()
    if not core:
        return message
    start = content.index(core)
    end = start + len(core)
    return {**message, "content": f"{content[:start]}{_IN}{core}{_OUT}{content[end:]}"}


def _spans(marked: str, generation: bool) -> tuple[str, list[tuple[int, int]], bool]:
    """The text of a rendering without its marks, the spans they enclose (sorted, overlaps merged: the
    content marks', and the generation blocks' when ``generation``), and whether every content mark
    that opens closes (a template that cuts a content may write one without the other)."""
    text: list[str] = []
    spans: list[tuple[int, int]] = []
    start = 0  # where the generation block open now opened
    content: int | None = None  # where the content mark open now opened
    paired = True
    length = 0
    for char in marked:
        if char == _OPEN:
            start = length
        elif char == _IN:
            paired = paired and content is None
            content = length
        elif char == _CLOSE:
            if generation:
                spans.append((start, length))
        elif char == _OUT:
            if content is None:
                paired = False
            else:
                spans.append((content, length))
                content = None
        else:
            text.append(char)
            length += 1
    merged: list[tuple[int, int]] = []
    for begin, end in sorted(spans):
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((begin, end))
    return "".join(text), merged, paired and content is None
