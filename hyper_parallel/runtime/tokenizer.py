"""Runtime of ``hyper_parallel.components.tokenizer``: a local Hugging Face ``tokenizer.json``.

Imported only from ``Tokenizer.Config.build``; this module imports the ``tokenizers`` library (part of
the ``torch`` extra). Nothing is fetched from a hub: the files must be on disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer as _RustTokenizer

if TYPE_CHECKING:
    from hyper_parallel.components.tokenizer import HuggingFaceTokenizer

__all__ = ["HFTokenizer", "build_hf_tokenizer"]


def _token_text(value: Any) -> str | None:
    """A special token of ``tokenizer_config.json``: a string, or an AddedToken dict with ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


class HFTokenizer:
    """Encode/decode with special-token ids; ``encode`` adds bos/eos as configured."""

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
    ) -> None:
        self._tok = tokenizer
        self.bos_token, self.bos_id = bos_token, self._id_of(bos_token, "bos_token")
        self.eos_token, self.eos_id = eos_token, self._id_of(eos_token, "eos_token")
        if pad_token is None:
            pad_token = eos_token
        self.pad_token, self.pad_id = pad_token, self._id_of(pad_token, "pad_token")
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.padding_side = padding_side
        self.model_max_length = model_max_length

    def _id_of(self, token: str | None, what: str) -> int | None:
        if token is None:
            return None
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise ValueError(f"{what} {token!r} is not in the tokenizer's vocabulary")
        return int(token_id)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, *, add_bos: bool | None = None, add_eos: bool | None = None) -> list[int]:
        """Token ids of ``text``, with bos/eos added per the config (or the arguments) when known."""
        ids = list(self._tok.encode(text, add_special_tokens=False).ids)
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        if (self.add_eos if add_eos is None else add_eos) and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``encode`` of each text (the Rust tokenizer batches the work)."""
        encoded = self._tok.encode_batch(texts, add_special_tokens=False)
        out = []
        for enc in encoded:
            ids = list(enc.ids)
            if self.add_bos and self.bos_id is not None:
                ids.insert(0, self.bos_id)
            if self.add_eos and self.eos_id is not None:
                ids.append(self.eos_id)
            out.append(ids)
        return out

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        """Text of ``ids``."""
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def pad(self, ids: list[int], length: int) -> list[int]:
        """``ids`` cut or padded with ``pad_id`` to ``length``, on ``padding_side``."""
        if self.pad_id is None:
            raise ValueError("the tokenizer has no pad token (and no eos token to fall back to)")
        ids = list(ids[:length])
        padding = [self.pad_id] * (length - len(ids))
        return padding + ids if self.padding_side == "left" else ids + padding


def _locate(path: str) -> tuple[Path, Path | None]:
    """``tokenizer.json`` and the optional ``tokenizer_config.json`` beside it, from a file or folder."""
    where = Path(path)
    file = where / "tokenizer.json" if where.is_dir() else where
    if not file.is_file():
        raise FileNotFoundError(f"no tokenizer file at {str(file)!r} (expected a local tokenizer.json)")
    config = file.parent / "tokenizer_config.json"
    return file, config if config.is_file() else None


def build_hf_tokenizer(cfg: HuggingFaceTokenizer.Config, weights_path: str | None) -> HFTokenizer:
    """Load ``cfg.path`` (or ``weights_path`` when it is null); config token overrides win."""
    path = cfg.path if cfg.path is not None else weights_path
    if path is None:
        raise ValueError("tokenizer.path is null and the model has no weights_path to load a tokenizer from")
    file, config_file = _locate(path)
    saved: dict[str, Any] = {}
    if config_file is not None:
        saved = json.loads(config_file.read_text(encoding="utf-8"))
    max_length = cfg.model_max_length
    if max_length is None and isinstance(saved.get("model_max_length"), int):
        max_length = saved["model_max_length"]
    return HFTokenizer(
        _RustTokenizer.from_file(str(file)),
        bos_token=cfg.bos_token or _token_text(saved.get("bos_token")),
        eos_token=cfg.eos_token or _token_text(saved.get("eos_token")),
        pad_token=cfg.pad_token or _token_text(saved.get("pad_token")),
        add_bos=cfg.add_bos,
        add_eos=cfg.add_eos,
        padding_side=cfg.padding_side,
        model_max_length=max_length,
    )
