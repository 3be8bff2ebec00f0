"""Runtime of ``hyper_parallel.components.tokenizer``: a local Hugging Face ``tokenizer.json``, or bytes.

Imported only from ``Tokenizer.Config.build``. Both tokenizers share one interface (``TokenizerRuntime``):
``encode`` / ``encode_batch`` add bos/eos as configured, ``decode``, ``pad``, ``vocab_size`` and the
special ids, which is all the data loader and the trainer use. ``HFTokenizer`` needs the ``tokenizers``
library (part of the ``torch`` extra) and files on disk: nothing is fetched from a hub. ``ByteLevelTokenizer``
needs neither. A tokenizer file that is missing or unreadable, or a special token it lacks, is an
``InputFileError`` naming the file (exit status 2).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hyper_parallel._json import loads
from hyper_parallel._paths import kind_problem
from hyper_parallel.errors import InputFileError, Issue, TextTooLong

if TYPE_CHECKING:
    from tokenizers import Tokenizer as _RustTokenizer

    from hyper_parallel.components.tokenizer import HuggingFaceTokenizer

_T = TypeVar("_T")

__all__ = [
    "ByteLevelTokenizer",
    "HFTokenizer",
    "TokenizerRuntime",
    "build_hf_tokenizer",
    "locate_tokenizer",
    "tokenizer_hub_id",
]


class TokenizerRuntime:
    """What every built tokenizer offers; subclasses supply ``_ids``, ``decode`` and ``vocab_size``.

    ``bos_id`` / ``eos_id`` / ``pad_id`` are None when the tokenizer has no such token; ``encode`` then
    adds nothing for it. ``model_max_length`` (None: unbounded) is the longest sequence the data loader
    may cut; ``padding_side`` is where ``pad`` (and the loader's unpacked samples) put padding.
    """

    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    #: The Jinja chat template of ``tokenizer_config.json``; None when the tokenizer has none.
    chat_template: str | None = None

    def __init__(
        self,
        *,
        add_bos: bool,
        add_eos: bool,
        padding_side: str = "right",
        model_max_length: int | None = None,
    ) -> None:
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.padding_side = padding_side
        self.model_max_length = model_max_length

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        raise NotImplementedError

    def _ids(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        raise NotImplementedError

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        """Text of ``ids``."""
        raise NotImplementedError

    def _with_specials(self, ids: list[int], add_bos: bool | None, add_eos: bool | None) -> list[int]:
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        if (self.add_eos if add_eos is None else add_eos) and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def encode(self, text: str, *, add_bos: bool | None = None, add_eos: bool | None = None) -> list[int]:
        """Token ids of ``text``, with bos/eos added per the config (or the arguments) when known."""
        return self._with_specials(self._ids([text])[0], add_bos, add_eos)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``encode`` of each text (a Rust tokenizer batches the work)."""
        return [self._with_specials(ids, None, None) for ids in self._ids(texts)]

    def encode_batch_flat(self, texts: list[str], dtype: Any) -> tuple[Any, Any]:
        """``encode_batch`` of ``texts`` end to end in one array of ``dtype``, and each text's length.

        The same ids as ``encode_batch``, without a list or an array per text: what ``prepare`` writes.
        """
        import numpy as np

        encoded = self._ids(texts)
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        body = np.fromiter(itertools.chain.from_iterable(encoded), dtype=dtype, count=int(lengths.sum()))
        return self._framed(body, lengths)

    def _framed(self, body: Any, lengths: Any) -> tuple[Any, Any]:
        """``encode_batch_flat`` from the texts' ids without specials: bos/eos added per the config."""
        import numpy as np

        head = self.add_bos and self.bos_id is not None
        tail = self.add_eos and self.eos_id is not None
        if not (head or tail):
            return body, lengths
        framed = lengths + int(head) + int(tail)
        ends = np.cumsum(framed)
        out = np.empty(int(ends[-1]) if ends.size else 0, dtype=body.dtype)
        special = np.zeros(out.size, dtype=bool)
        if head:
            out[ends - framed] = self.bos_id
            special[ends - framed] = True
        if tail:
            out[ends - 1] = self.eos_id
            special[ends - 1] = True
        out[~special] = body
        return out, framed

    def pad(self, ids: list[int], length: int) -> list[int]:
        """``ids`` cut or padded with ``pad_id`` to ``length``, on ``padding_side``."""
        if self.pad_id is None:
            raise ValueError("the tokenizer has no pad token (and no eos token to fall back to)")
        ids = list(ids[:length])
        padding = [self.pad_id] * (length - len(ids))
        return padding + ids if self.padding_side == "left" else ids + padding


class ByteLevelTokenizer(TokenizerRuntime):
    """UTF-8 bytes are ids 0-255; BOS, EOS and PAD are 256, 257 and 258 (see ``ByteTokenizer``)."""

    bos_token, eos_token, pad_token = "<s>", "</s>", "<pad>"
    bos_id, eos_id, pad_id = 256, 257, 258

    @property
    def vocab_size(self) -> int:
        """259: the byte values and the three special ids."""
        return self.pad_id + 1

    def _ids(self, texts: list[str]) -> list[list[int]]:
        return [list(text.encode("utf-8")) for text in texts]

    def encode_batch_flat(self, texts: list[str], dtype: Any) -> tuple[Any, Any]:
        """``encode_batch_flat`` straight from the UTF-8 bytes of the whole batch (no ints in between)."""
        import numpy as np

        encoded = [text.encode("utf-8") for text in texts]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        body = np.frombuffer(b"".join(encoded), dtype=np.uint8).astype(dtype)
        return self._framed(body, lengths)

    def encode_with_offsets(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Ids of each text without bos/eos, with each token's character span ``(start, end)``.

        What a chat template's rendering is encoded with: there, ``<s>``, ``</s>`` and ``<pad>`` are the
        special ids (a template writes the special tokens as text, as Hugging Face's do, and the export
        encodes them so); everything else is its UTF-8 bytes, each byte spanning its character."""
        specials = {self.bos_token: self.bos_id, self.eos_token: self.eos_id, self.pad_token: self.pad_id}
        pattern = re.compile("|".join(re.escape(token) for token in specials))
        out = []
        for text in texts:
            ids: list[int] = []
            offsets: list[tuple[int, int]] = []
            at = 0
            for match in [*pattern.finditer(text), None]:
                end = len(text) if match is None else match.start()
                for index in range(at, end):
                    piece = text[index].encode("utf-8")
                    ids.extend(piece)
                    offsets.extend([(index, index + 1)] * len(piece))
                if match is not None:
                    ids.append(specials[match.group()])
                    offsets.append(match.span())
                    at = match.end()
            out.append((ids, offsets))
        return out

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        """Bytes decoded as UTF-8 (invalid sequences become U+FFFD); specials as ``<s>``, ``</s>``, ``<pad>``.

        ``skip_special_tokens`` drops the special ids instead.
        """
        names = {self.bos_id: self.bos_token, self.eos_id: self.eos_token, self.pad_id: self.pad_token}
        parts: list[str] = []
        run = bytearray()
        for token in ids:
            if 0 <= token < 256:
                run.append(token)
                continue
            if token not in names:
                raise ValueError(f"token id {token} is outside the byte vocabulary [0, {self.vocab_size})")
            parts.append(run.decode("utf-8", errors="replace"))
            run.clear()
            if not skip_special_tokens:
                parts.append(names[token])
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)


def _token_text(value: Any) -> str | None:
    """A special token of ``tokenizer_config.json``: a string, or an AddedToken dict with ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


class HFTokenizer(TokenizerRuntime):
    """A ``tokenizers`` tokenizer with special tokens chosen by the config or ``tokenizer_config.json``."""

    #: The most the normalizer and the pre-tokenizer can lengthen text (read when loaded, ``_growth``).
    normalizer_growth: float = 1.0
    pre_tokenizer_growth: float = 1.0

    def __init__(
        self,
        tokenizer: _RustTokenizer,
        *,
        bos_token: str | None,
        eos_token: str | None,
        pad_token: str | None,
        add_bos: bool,
        add_eos: bool,
        padding_side: str = "right",
        model_max_length: int | None = None,
        source: str | None = None,
        configured: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(
            add_bos=add_bos, add_eos=add_eos, padding_side=padding_side, model_max_length=model_max_length
        )
        self._tok = tokenizer
        #: The ``tokenizer.json`` read (None: built in Python); errors about the tokenizer name it.
        self.source = source
        self._configured = configured  # special tokens the config set (the others: tokenizer_config.json)
        self.bos_token, self.bos_id = bos_token, self._id_of(bos_token, "bos_token")
        self.eos_token, self.eos_id = eos_token, self._id_of(eos_token, "eos_token")
        if pad_token is None:
            pad_token = eos_token
        self.pad_token, self.pad_id = pad_token, self._id_of(pad_token, "pad_token")

    def __getstate__(self) -> dict[str, Any]:
        # The library's pickle keeps the tokenizer.json but not this switch (set after loading).
        return {**self.__dict__, "_encode_special_tokens": bool(self._tok.encode_special_tokens)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        flag = state.pop("_encode_special_tokens")
        self.__dict__.update(state)
        self._tok.encode_special_tokens = flag

    def _id_of(self, token: str | None, what: str) -> int | None:
        if token is None:
            return None
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            message = f"{what} {token!r} is not in the tokenizer's vocabulary"
            if self.source is None:
                raise ValueError(message)
            named = f"tokenizer.{what}" if what in self._configured else "its tokenizer_config.json"
            raise InputFileError.at(self.source, f"{message} (named by {named})")
        return int(token_id)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def text_problem(self, text: str) -> str | None:
        """Why ``text`` is too long for one encoding under this tokenizer's growth (``_growth``), or None.

        Cheap unless the text times the growth read from the description passes ``MAX_ENCODE_CHARS``:
        then its normalized and pre-tokenized length is measured, in chunks each bounded the same way."""
        from hyper_parallel.components.tokenizer._growth import MAX_ENCODE_CHARS

        if len(text) * self.normalizer_growth * self.pre_tokenizer_growth <= MAX_ENCODE_CHARS:
            return None
        too_long = (
            f"a text of {len(text):,} characters grows past {MAX_ENCODE_CHARS:,} characters under the "
            "tokenizer's normalizer and pre-tokenizer, more than one encoding may hold"
        )
        normalized = self._grown(text, pre_tokenized=False)
        if normalized > MAX_ENCODE_CHARS:
            return too_long
        if normalized * self.pre_tokenizer_growth <= MAX_ENCODE_CHARS:
            return None
        return too_long if self._grown(text, pre_tokenized=True) > MAX_ENCODE_CHARS else None

    def _grown(self, text: str, *, pre_tokenized: bool) -> int:
        """Characters of ``text`` normalized (and pre-tokenized), measured a bounded chunk at a time and
        only until ``MAX_ENCODE_CHARS`` is passed."""
        from hyper_parallel.components.tokenizer._growth import MAX_ENCODE_CHARS

        normalizer, pre = self._tok.normalizer, self._tok.pre_tokenizer
        chunk = max(1, int(MAX_ENCODE_CHARS // (8 * self.normalizer_growth * self.pre_tokenizer_growth)))
        grown = 0
        for begin in range(0, len(text), chunk):
            piece = text[begin : begin + chunk]
            if normalizer is not None:
                piece = normalizer.normalize_str(piece)
            if pre_tokenized and pre is not None:
                grown += sum(len(split) for split, _ in pre.pre_tokenize_str(piece))
            else:
                grown += len(piece)
            if grown > MAX_ENCODE_CHARS:
                break
        return grown

    def _grouped(self, texts: list[str], encode: Callable[[list[str]], list[_T]]) -> list[_T]:
        """``encode`` of ``texts`` in groups whose characters times the growth fit ``MAX_ENCODE_CHARS``
        (a text past it alone, once ``text_problem`` has measured it); ``TextTooLong`` naming the first
        text too long."""
        from hyper_parallel.components.tokenizer._growth import MAX_ENCODE_CHARS

        growth = self.normalizer_growth * self.pre_tokenizer_growth
        out: list[_T] = []
        group: list[str] = []
        held = 0.0
        for index, text in enumerate(texts):
            problem = self.text_problem(text)
            if problem is not None:
                raise TextTooLong(index, problem)
            weight = len(text) * growth
            if group and held + weight > MAX_ENCODE_CHARS:
                out.extend(encode(group))
                group, held = [], 0.0
            group.append(text)
            held += weight
        if group:
            out.extend(encode(group))
        return out

    def _ids(self, texts: list[str]) -> list[list[int]]:
        # ``encode_batch_fast`` (newer ``tokenizers``): the same ids, without the character offsets
        encode = getattr(self._tok, "encode_batch_fast", None) or self._tok.encode_batch
        return self._grouped(
            texts, lambda group: [enc.ids for enc in encode(group, add_special_tokens=False)]
        )

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        """Text of ``ids``."""
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def encode_with_offsets(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Ids of each text without bos/eos, with each token's character span ``(start, end)``."""
        return self._grouped(
            texts,
            lambda group: [
                (list(enc.ids), [(int(a), int(b)) for a, b in enc.offsets])
                for enc in self._tok.encode_batch(group, add_special_tokens=False)
            ],
        )


def locate_tokenizer(path: str) -> tuple[Path, Path | None]:
    """``tokenizer.json`` and the optional ``tokenizer_config.json`` beside it, from a file or folder, or
    from the Hub cache's snapshot of a Hub id ``org/name[@revision]`` (not cached and offline: one line
    naming the id and the cache searched)."""
    where = Path(_from_hub(path))
    file = where / "tokenizer.json" if where.is_dir() else where
    config = file.parent / "tokenizer_config.json"
    for named in (file, config):  # a FIFO would be waited on (and the config never silently skipped)
        problem = kind_problem(named)
        if problem is not None:
            raise InputFileError.at(named, problem)
    if not file.is_file():
        raise InputFileError.at(file, "no tokenizer file here (expected a local tokenizer.json)")
    return file, config if config.is_file() else None


def tokenizer_hub_id(path: str) -> str | None:
    """The Hub id whose cache snapshot holds the tokenizer ``path`` names: ``path`` itself when it is a Hub
    id, the id of a model's snapshot folder still without its tokenizer (only its ``config.json`` was
    looked up when the config was resolved); None for a local file or folder."""
    from hyper_parallel._hub import hub_id_of, is_hub_id

    if is_hub_id(path):
        return path
    return None if (Path(path) / "tokenizer.json").exists() else hub_id_of(path)


def _from_hub(path: str) -> str:
    """``path``, or the snapshot folder holding the tokenizer of the Hub id it names (``tokenizer_hub_id``),
    fetched when online and not cached."""
    from hyper_parallel._hub import TOKENIZER_FILES, snapshot

    hub_id = tokenizer_hub_id(path)
    if hub_id is None:
        return path
    try:
        return snapshot(hub_id, TOKENIZER_FILES)
    except ValueError as exc:  # one line naming both readings of the path, exit status 2
        raise InputFileError([Issue("tokenizer.path", str(exc), "")]) from None


def read_tokenizer_config(config_file: Path | None) -> dict[str, Any]:
    """The ``tokenizer_config.json`` object ``locate_tokenizer`` found (empty without one).

    A file that is not UTF-8 JSON holding an object is an ``InputFileError`` naming it; the loader and the
    export read it through here.
    """
    if config_file is None:
        return {}
    try:
        saved = loads(config_file.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputFileError.at(config_file, f"not a JSON file: {exc}") from None
    if not isinstance(saved, dict):
        raise InputFileError.at(config_file, "not a JSON object")
    return saved


def _described(part: Any) -> Any:
    """The JSON of a normalizer or pre-tokenizer, as ``tokenizer.json`` holds it (None: unreadable)."""
    try:
        return loads(part.__getstate__())
    except (ValueError, TypeError, AttributeError):
        return None


def _refuse_growth(file: Path, rust: _RustTokenizer) -> tuple[float, float]:
    """The growth of the normalizer and of the pre-tokenizer (see ``_growth``); a tokenizer whose two
    together can lengthen text more than ``MAX_GROWTH`` times is refused."""
    from hyper_parallel.components.tokenizer._growth import (
        MAX_GROWTH,
        normalizer_growth,
        pre_tokenizer_growth,
    )

    normalizer, pre = rust.normalizer, rust.pre_tokenizer
    grows = normalizer_growth(None if normalizer is None else _described(normalizer))
    splits = pre_tokenizer_growth(None if pre is None else _described(pre))
    growth = grows * splits
    if growth > MAX_GROWTH:
        shown = "without bound" if growth == float("inf") else f"{growth:,.0f} times"
        what = "its normalizer" if splits == 1 else "its normalizer and pre-tokenizer"
        if grows == 1:
            what = "its pre-tokenizer"
        raise InputFileError.at(
            file, f"{what} can lengthen text {shown} (at most {MAX_GROWTH} accepted): refused"
        )
    return grows, splits


def build_hf_tokenizer(cfg: HuggingFaceTokenizer.Config, weights_path: str | None) -> HFTokenizer:
    """Load ``cfg.path`` (or ``weights_path`` when it is null); config token overrides win."""
    from tokenizers import Tokenizer as RustTokenizer

    path = cfg.path if cfg.path is not None else weights_path
    if path is None:
        raise ValueError("tokenizer.path is null and the model has no weights_path to load a tokenizer from")
    file, config_file = locate_tokenizer(path)
    saved = read_tokenizer_config(config_file)
    max_length = cfg.model_max_length
    if max_length is None and isinstance(saved.get("model_max_length"), int):
        max_length = saved["model_max_length"]
    try:
        rust = RustTokenizer.from_file(str(file))
    except Exception as exc:  # the library raises a bare Exception for any unreadable file
        reason = str(exc).strip() or type(exc).__name__
        raise InputFileError.at(
            file, f"not a tokenizer file the tokenizers library reads: {reason}"
        ) from None
    grows, splits = _refuse_growth(file, rust)
    # transformers' switch (our byte tokenizer's export sets it): a special token's text in the input is
    # encoded as text, not as the special id.
    rust.encode_special_tokens = saved.get("split_special_tokens") is True
    configured = frozenset(
        name for name in ("bos_token", "eos_token", "pad_token") if getattr(cfg, name) is not None
    )
    built = HFTokenizer(
        rust,
        bos_token=cfg.bos_token or _token_text(saved.get("bos_token")),
        eos_token=cfg.eos_token or _token_text(saved.get("eos_token")),
        pad_token=cfg.pad_token or _token_text(saved.get("pad_token")),
        add_bos=cfg.add_bos,
        add_eos=cfg.add_eos,
        padding_side=cfg.padding_side,
        model_max_length=max_length,
        source=str(file),
        configured=configured,
    )
    template = cfg.chat_template_text()
    if template is None and isinstance(saved.get("chat_template"), str) and saved["chat_template"]:
        template = saved["chat_template"]  # the tokenizer's own
    built.chat_template = template
    built.normalizer_growth, built.pre_tokenizer_growth = grows, splits
    return built
