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

Images are read with Pillow: only the header here (:func:`image_size`: the size, the pixel bound), the
pixels when a batch is loaded (``_pictures``). An image larger than Pillow's ``MAX_IMAGE_PIXELS`` is
refused as a decompression bomb (``IMAGE: problem``), before any pixel is decoded. :func:`fitted_size` is
the size an image is resized to: its aspect ratio kept, each side a multiple of the vision tower's patch
size times its merge size, the area within ``image_min_pixels`` and ``image_max_pixels`` (the rule of the
Qwen-VL image processors). Torch-free: ``--dry-run`` runs these checks.
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from hyper_parallel._json import loads
from hyper_parallel.config.errors import InputFileError

if TYPE_CHECKING:
    from hyper_parallel.components.dataloader.sources import ImageChatSource

__all__ = [
    "MAX_ASPECT_RATIO",
    "ChatRecord",
    "Geometry",
    "Part",
    "encode_record",
    "fitted_size",
    "image_size",
    "open_image",
    "check_image_chat_encoding",
    "read_records",
]

#: Longest side over shortest side an image may have (the Qwen-VL image processors refuse more).
MAX_ASPECT_RATIO = 200


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


def image_size(image: Path, where: str) -> tuple[int, int]:
    """``(width, height)`` of ``image`` from its header, refusing what cannot be read or is too large.

    A missing file is refused at ``where`` (the record naming it); an unreadable image or one above
    Pillow's ``MAX_IMAGE_PIXELS`` (a decompression bomb) at the image file itself.
    """
    if not image.is_file():
        raise InputFileError.at(where, f"image {str(image)!r} does not exist")
    with open_image(image) as opened:
        width, height = opened.size
    return int(width), int(height)


@contextlib.contextmanager
def open_image(image: Path) -> Iterator[Any]:
    """``image`` opened with Pillow (its header read, no pixels yet), with Pillow's decompression-bomb
    warning turned into a refusal: every reader of an image goes through here. An unreadable image, or
    one above ``PIL.Image.MAX_IMAGE_PIXELS``, is ``IMAGE: problem`` (``InputFileError``)."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(image) as opened:
                yield opened
    except (Image.DecompressionBombWarning, Image.DecompressionBombError):
        raise InputFileError.at(
            image,
            f"holds more than Pillow's limit of {Image.MAX_IMAGE_PIXELS} pixels (PIL.Image."
            "MAX_IMAGE_PIXELS): a decompression bomb, or an image to shrink before training",
        ) from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise InputFileError.at(image, f"not an image Pillow can read: {exc}") from None


def fitted_size(width: int, height: int, *, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """``(width, height)`` an image is resized to (module docs); ``ValueError`` past the aspect ratio."""
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise ValueError(
            f"{width} x {height} pixels: the aspect ratio exceeds {MAX_ASPECT_RATIO}, which the vision "
            "tower does not take"
        )
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return w, h


@attrs.frozen
class Geometry:
    """How images become vision tokens: the vision tower's patch and merge sizes, the pixel bounds."""

    patch: int
    merge: int
    min_pixels: int
    max_pixels: int

    @classmethod
    def of(cls, vision: Any, bounds: tuple[int, int]) -> Geometry:
        """The geometry of a vision tower (``vision``: its arguments) and ``(min_pixels, max_pixels)``."""
        return cls(int(vision.patch_size), int(vision.spatial_merge_size), *bounds)

    def fitted(self, image: Path, where: str) -> tuple[int, int]:
        """The size ``image`` is resized to (:func:`fitted_size`), refused at the image when it cannot be."""
        width, height = image_size(image, where)
        try:
            return fitted_size(
                width,
                height,
                factor=self.patch * self.merge,
                min_pixels=self.min_pixels,
                max_pixels=self.max_pixels,
            )
        except ValueError as exc:
            raise InputFileError.at(image, str(exc)) from None

    def tokens(self, size: tuple[int, int]) -> int:
        """Language-model tokens of an image resized to ``size`` (one per merged block of patches)."""
        width, height = size
        return (width // self.patch) * (height // self.patch) // self.merge**2


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
