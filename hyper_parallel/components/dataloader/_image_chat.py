"""Reading the ``image_chat`` dataset source: JSON lines of chat messages whose content holds images.

The format of Qwen-VL fine-tuning sets, one conversation per line::

    {"messages": [
      {"role": "user", "content": [{"type": "image", "image": "pics/cat.png"},
                                   {"type": "text", "text": "What is this?"}]},
      {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}]}

``content`` is a list of parts (``{"type": "text", "text": ...}`` or ``{"type": "image", "image": PATH}``)
or a plain string (text only). An image path is relative to the JSON lines file's folder (or absolute).
Every conversation holds at least one image, in a turn other than the assistant's, and an assistant turn
(the tokens the loss is taken on). Anything else is an ``InputFileError`` at ``FILE:LINE``.

How an image becomes vision tokens (its size within ``image_min_pixels`` and ``image_max_pixels``, its
token count, its pixels) is the model's image processor, :mod:`hyper_parallel.models.qwen3_5.images`:
only the header is read here, the pixels when a batch is loaded. Torch-free: ``--dry-run`` runs these
checks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from hyper_parallel._json import loads
from hyper_parallel.errors import InputFileError
from hyper_parallel.models.qwen3_5.images import Geometry

if TYPE_CHECKING:
    from hyper_parallel.components.dataloader.sources import ImageChatSource

__all__ = ["ChatRecord", "Part", "check_image_chat_encoding", "encode_record", "read_records"]


@attrs.frozen
class Part:
    """One part of a message's content: ``text`` or an ``image`` (its resolved path in ``value``)."""

    kind: str
    value: str


@attrs.frozen
class ChatRecord:
    """One conversation: where it is (``FILE:LINE``) and its messages as ``(role, parts)``."""

    where: str
    messages: tuple[tuple[str, tuple[Part, ...]], ...]

    @property
    def images(self) -> tuple[Path, ...]:
        return tuple(Path(p.value) for _, parts in self.messages for p in parts if p.kind == "image")


def _part(raw: object, folder: Path, index: str) -> Part:
    if not isinstance(raw, dict) or raw.get("type") not in ("text", "image"):
        raise ValueError(f"{index} is not an object with type 'text' or 'image'")
    kind = raw["type"]
    value = raw.get(kind)
    if not isinstance(value, str) or (kind == "image" and not value):
        raise ValueError(f"{index} has no string {kind!r}")
    return Part(kind, str(folder / value) if kind == "image" else value)


def _record(line: str, where: str, folder: Path) -> ChatRecord:
    try:
        record = loads(line)
    except json.JSONDecodeError as exc:
        raise InputFileError.at(where, f"not a JSON object: {exc.msg} at column {exc.colno}") from None
    raw = record.get("messages") if isinstance(record, dict) else None
    if not isinstance(raw, list) or not raw:
        raise InputFileError.at(where, "not a JSON object with a 'messages' list")
    messages = []
    try:
        for i, message in enumerate(raw):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise ValueError(f"messages[{i}] is not an object with a string 'role'")
            content = message.get("content")
            if isinstance(content, str):
                parts: tuple[Part, ...] = (Part("text", content),)
            elif isinstance(content, list):
                parts = tuple(_part(p, folder, f"messages[{i}].content[{j}]") for j, p in enumerate(content))
            else:
                raise ValueError(f"messages[{i}] has no 'content' string or list of parts")
            if message["role"] == "assistant" and any(p.kind == "image" for p in parts):
                raise ValueError(f"messages[{i}]: an assistant turn holds an image; images go in other turns")
            messages.append((message["role"], parts))
    except ValueError as exc:
        raise InputFileError.at(where, str(exc)) from None
    chat = ChatRecord(where, tuple(messages))
    if not chat.images:
        raise InputFileError.at(where, "no image: every image_chat conversation holds at least one")
    if not any(role == "assistant" for role, _ in chat.messages):
        raise InputFileError.at(where, "no assistant turn: nothing would be trained on")
    return chat


def read_records(file: Path, limit: int | None = None) -> Iterator[ChatRecord]:
    """The conversations of one JSON lines file (the first ``limit``), blank lines skipped."""
    count = 0
    with file.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            if limit is not None and count >= limit:
                return
            where = f"{file}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputFileError.at(where, f"not UTF-8 text: byte 0x{raw[exc.start]:02x}") from None
            if line.strip():
                count += 1
                yield _record(line, where, file.parent)


def encode_record(
    record: ChatRecord, tokenizer: Any, image_token_id: int, geometry: Geometry, seq_len: int
) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """Ids, assistant mask and resized image sizes of one conversation under the built-in chat format.

    Each image is ``geometry.tokens`` copies of ``image_token_id`` (never trained on). Refused at the
    record: text the tokenizer encodes to ``image_token_id``, more tokens than ``seq_len`` (a conversation
    is never cut: a cut would drop image tokens or the answer without a word).
    """
    from hyper_parallel.data.chat import builtin_chat

    sizes: list[tuple[int, int]] = []
    messages: list[dict[str, str | list[str | list[int]]]] = []
    for role, parts in record.messages:
        content: list[str | list[int]] = []
        for part in parts:
            if part.kind == "text":
                content.append(part.value)
                continue
            size = geometry.fitted(Path(part.value), record.where)
            sizes.append(size)
            content.append([image_token_id] * geometry.tokens(size))
        messages.append({"role": role, "content": content})
    ids, mask = builtin_chat(tokenizer, messages)
    placeholders = sum(geometry.tokens(size) for size in sizes)
    if ids.count(image_token_id) != placeholders:
        raise InputFileError.at(
            record.where,
            f"its text encodes to the image token id {image_token_id}: set the model's image_token_id to "
            "an id the tokenizer never produces",
        )
    if len(ids) > seq_len:
        raise InputFileError.at(
            record.where,
            f"takes {len(ids)} tokens ({placeholders} of them for {len(sizes)} image(s)), more than "
            f"training.seq_len {seq_len}: raise seq_len, lower dataloader.dataset.image_max_pixels or "
            "shorten the conversation",
        )
    return ids, mask, sizes


def check_image_chat_encoding(cfg: ImageChatSource, tokenizer: Any, model_args: Any, seq_len: int) -> None:
    """The first conversations of each ``image_chat`` file encoded as ``_samples.image_chat_samples`` will
    (within ``seq_len``, no text on the image id), for ``--dry-run``; nothing to check without a vision
    tower (the trainer rules refuse that already). Torch-free: only sizes are computed."""
    from hyper_parallel.components.dataloader._sources import CHECKED_RECORDS, image_chat_files

    vision, image_token_id = getattr(model_args, "vision", None), getattr(model_args, "image_token_id", None)
    if vision is None or image_token_id is None:
        return
    geometry = Geometry.of(vision, cfg.pixel_bounds())
    for file in image_chat_files(cfg.paths):
        for record in read_records(file, CHECKED_RECORDS):
            encode_record(record, tokenizer, image_token_id, geometry, seq_len)
