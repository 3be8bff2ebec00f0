"""The Hugging Face tokenizer files of a configured tokenizer, for ``hyper_parallel.export``.

An exported model folder is only usable with the tokenizer it was trained with, so the export writes
``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` beside the weights:
``AutoTokenizer.from_pretrained(folder)`` and ``python -m hyper_parallel.generate folder`` then need nothing
else. A Hugging Face tokenizer's ``tokenizer.json`` is copied as it is; its ``tokenizer_config.json`` gets
the config's token overrides, so the folder encodes exactly as training did.

The byte tokenizer has no files, so an equivalent ``tokenizer.json`` is built with the ``tokenizers``
library: byte-level pre-tokenization (every byte becomes one character of GPT-2's byte alphabet, with
no regex split and no prefix space), a BPE model without merges whose vocabulary gives each byte's
character the byte's value as id, the byte-level decoder, and ``<s>``, ``</s>``, ``<pad>`` as special
tokens 256, 257 and 258. ``split_special_tokens`` in ``tokenizer_config.json`` keeps a literal ``"<s>"``
in a text as its three bytes, as ``ByteTokenizer`` does. Encoding a prompt adds ``<s>`` when the config's
``add_bos`` is set (the post-processor) but never ``</s>``: a prompt is meant to be continued.

Imports ``tokenizers`` (not torch); called by the export only.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from hyper_parallel._json import loads

if TYPE_CHECKING:
    from hyper_parallel.components.tokenizer import Tokenizer

__all__ = ["TOKENIZER_FILES", "byte_alphabet", "byte_tokenizer_json", "tokenizer_files"]

#: The files the export writes for any tokenizer, in this order.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

#: Token overrides of ``HuggingFaceTokenizer.Config`` and their keys in ``tokenizer_config.json``.
_OVERRIDES = ("bos_token", "eos_token", "pad_token", "model_max_length", "padding_side")


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the printable character standing for each byte value 0-255.

    Printable Latin-1 bytes stand for themselves; the others (controls, space, soft hyphen) take the
    characters from U+0100 on, in byte order: the mapping the ``ByteLevel`` pre-tokenizer applies.
    """
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    alphabet: dict[int, str] = {}
    extra = 0
    for byte in range(256):
        if byte in printable:
            alphabet[byte] = chr(byte)
        else:
            alphabet[byte] = chr(0x100 + extra)
            extra += 1
    return alphabet


def byte_tokenizer_json(*, add_bos: bool) -> str:
    """``tokenizer.json`` text of a tokenizer giving ``ByteTokenizer``'s ids for every text."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    from hyper_parallel.components.tokenizer._runtime import ByteLevelTokenizer

    vocab = {char: byte for byte, char in byte_alphabet().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = _byte_specials()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    for token, token_id in specials.items():
        if tokenizer.token_to_id(token) != token_id:  # the ids follow the 256 bytes, in this order
            raise AssertionError(f"{token} got id {tokenizer.token_to_id(token)}, not {token_id}")
    bos = ByteLevelTokenizer.bos_token
    if add_bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, specials[bos])]
        )
    return str(tokenizer.to_str(pretty=True))


def _byte_specials() -> dict[str, int]:
    from hyper_parallel.components.tokenizer._runtime import ByteLevelTokenizer as Byte

    return {Byte.bos_token: Byte.bos_id, Byte.eos_token: Byte.eos_id, Byte.pad_token: Byte.pad_id}


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def tokenizer_files(cfg: Tokenizer.Config, weights_path: str | None) -> dict[str, bytes]:
    """File name -> content of the Hugging Face tokenizer files of ``cfg`` (see the module docstring).

    ``weights_path`` is the model's, where a Hugging Face tokenizer without ``path`` lives. Raises
    ``ValueError`` (one line naming the file) when a tokenizer's files cannot be read, and
    ``NotImplementedError`` for a tokenizer kind that cannot be written as Hugging Face files.
    """
    from hyper_parallel.components.tokenizer import ByteTokenizer, HuggingFaceTokenizer

    if isinstance(cfg, ByteTokenizer.Config):
        specials = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **specials,
            "split_special_tokens": True,
            "clean_up_tokenization_spaces": False,
        }
        return {
            "tokenizer.json": byte_tokenizer_json(add_bos=cfg.add_bos).encode("utf-8") + b"\n",
            "tokenizer_config.json": _json(config),
            "special_tokens_map.json": _json(specials),
        }
    if isinstance(cfg, HuggingFaceTokenizer.Config):
        return _hf_files(cfg, weights_path)
    raise NotImplementedError(f"{type(cfg).__qualname__} cannot be written as Hugging Face tokenizer files")


def _hf_files(cfg: Any, weights_path: str | None) -> dict[str, bytes]:
    """The configured ``tokenizer.json`` copied, its ``tokenizer_config.json`` with the config's overrides."""
    from hyper_parallel.components.tokenizer._runtime import locate_tokenizer, read_tokenizer_config

    where = cfg.path if cfg.path is not None else weights_path
    if where is None:
        raise ValueError("tokenizer.path is null and the model has no weights_path to read a tokenizer from")
    try:
        file, config_file = locate_tokenizer(where)
        files = {"tokenizer.json": file.read_bytes()}
        saved = read_tokenizer_config(config_file)
        specials_file = file.parent / "special_tokens_map.json"
        special_map = loads(specials_file.read_text(encoding="utf-8")) if specials_file.is_file() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"tokenizer {where!r}: {exc}") from None
    for key in _OVERRIDES:
        value = getattr(cfg, key)
        if key == "padding_side" and value == "right" and key not in saved:
            continue  # the default on both sides
        if value is not None:
            saved[key] = value
    if not isinstance(special_map, dict):
        special_map = {}
    for key in ("bos_token", "eos_token", "pad_token"):
        if getattr(cfg, key) is not None:
            special_map[key] = getattr(cfg, key)
        elif key in saved and key not in special_map:
            special_map[key] = saved[key]
    saved.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    files["tokenizer_config.json"] = _json(saved)
    files["special_tokens_map.json"] = _json(special_map)
    return files
