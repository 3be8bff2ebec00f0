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
the EOS id, and the assistant content and that EOS are what is trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ChatRenderer", "builtin_chat"]

_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use characters marking generation spans while rendering


def builtin_chat(tokenizer: Any, messages: Sequence[dict[str, str]]) -> tuple[list[int], list[int]]:
    """Ids and assistant mask of ``messages`` under the built-in template (the module docstring)."""
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
        add(f"<|{message['role']}|>\n", 0)
        if message["role"] == "assistant":
            add(message["content"], 1)
            if eos is not None:
                ids.append(eos)
                mask.append(1)
        else:
            add(message["content"] + "\n", 0)
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
        if source is None:
            return
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

        environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
        )
        environment.globals["raise_exception"] = _raise
        try:
            self._template = environment.from_string(source)
        except jinja2.exceptions.TemplateError as exc:
            raise ValueError(f"the chat_template does not parse: {exc}") from None

    def render(self, messages: Sequence[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and its assistant character spans ``[start, end)`` (template tokenizers only)."""
        import jinja2

        assert self._template is not None
        tok = self.tokenizer
        for message in messages:
            if _OPEN in message["content"] or _CLOSE in message["content"]:
                raise ValueError("a message holds the private-use characters U+E000/U+E001")
        try:
            marked = self._template.render(
                messages=list(messages),
                add_generation_prompt=False,
                bos_token=getattr(tok, "bos_token", None) or "",
                eos_token=getattr(tok, "eos_token", None) or "",
                pad_token=getattr(tok, "pad_token", None) or "",
            )
        except jinja2.exceptions.TemplateError as exc:
            raise ValueError(f"the chat_template failed: {exc}") from None
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
