"""The chat templates a tokenizer can name: built-in presets, the built-in format as Jinja, or a file.

``tokenizer.chat_template`` is the one setting that says how a conversation becomes text, read by every
command that renders one (``prepare``, the ``chat`` data, ``generate --chat``, the export's
``tokenizer_config.json``):

- null: the tokenizer's own template (a Hugging Face ``tokenizer_config.json``'s ``chat_template``), else
  the built-in format (``hyper_parallel.data.chat``);
- a preset name: ``chatml``, ``llama3``, or ``builtin`` (the built-in format written as Jinja, for a
  tokenizer that has a template of its own);
- a path to a Jinja file (a value with a ``/`` or a ``.jinja`` / ``.j2`` suffix).

Every preset marks what is trained on with ``{% generation %} ... {% endgeneration %}`` (the convention
``apply_chat_template(..., return_assistant_tokens_mask=True)`` reads), around the assistant's content and
the token that ends its turn, so the model learns to stop. ``builtin_template`` is the built-in format as
Jinja: rendered and encoded with the special tokens' texts read as the special ids (the convention of every
Hugging Face template, and of ``ByteLevelTokenizer.encode_with_offsets``), it gives exactly
``builtin_chat``'s ids, and it is what the export writes for a run that used the built-in format, so
``AutoTokenizer.apply_chat_template`` on the export gives the ids training had.

Pure text (no torch, no file read at import): the config module validates names against ``PRESETS``.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = [
    "MAX_TEMPLATE_BYTES",
    "PRESETS",
    "builtin_template",
    "is_template_file",
    "read_template",
    "read_template_file",
]

#: Largest chat template file read (real ones are a few KiB; Qwen's longest about 8).
MAX_TEMPLATE_BYTES = 1 << 20


def builtin_template(*, add_bos: bool) -> str:
    """The built-in format (``hyper_parallel.data.chat``'s docstring) as a Jinja chat template.

    ``add_bos`` is the tokenizer's: the built-in format starts with BOS only when the tokenizer adds one,
    and a template cannot see that setting, so it is written in. Only text contents (an ``image_chat``
    conversation's image ids are not text)."""
    head = "{{ bos_token }}" if add_bos else ""
    return (
        head + "{% for message in messages %}"
        "{{ '<|' + message['role'] + '|>\\n' }}"
        "{% if message['role'] == 'assistant' %}"
        "{% generation %}{{ message['content'] }}{{ eos_token }}{% endgeneration %}"
        "{% else %}{{ message['content'] + '\\n' }}{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    )


_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_LLAMA3 = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

#: Preset name -> Jinja text; ``builtin`` depends on the tokenizer's ``add_bos`` (``builtin_template``).
PRESETS: dict[str, str | None] = {
    "builtin": None,
    "chatml": _CHATML,
    "llama3": _LLAMA3,
}

_NAME = re.compile(r"[A-Za-z0-9_-]+")


def is_template_file(value: str) -> bool:
    """Whether ``value`` names a file (not a preset): it has a path separator or a Jinja suffix, or is not
    a plain name."""
    return "/" in value or "\\" in value or value.endswith((".jinja", ".j2")) or not _NAME.fullmatch(value)


def read_template(value: str, *, add_bos: bool) -> str:
    """The Jinja text ``value`` (a preset name or a file, see the module docstring) names.

    ``KeyError`` for an unknown preset name; for a file, what ``read_template_file`` raises."""
    if not is_template_file(value):
        text = PRESETS[value]
        return builtin_template(add_bos=add_bos) if text is None else text
    return read_template_file(Path(value))


def read_template_file(path: Path) -> str:
    """The text of the Jinja file ``path``: ``OSError`` (``FileNotFoundError`` when there is none, a
    ``NotRegularFileError`` at once for a FIFO, socket or device, whose read would wait) or
    ``UnicodeDecodeError`` when it cannot be read as UTF-8, ``ValueError`` when it holds more than
    ``MAX_TEMPLATE_BYTES``."""
    from hyper_parallel._paths import read_regular

    return read_regular(path, MAX_TEMPLATE_BYTES).decode("utf-8")
