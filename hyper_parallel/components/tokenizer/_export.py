"""The Hugging Face tokenizer files of a configured tokenizer, for ``hyper_parallel.export``.

An exported model folder is only usable with the tokenizer it was trained with, so the export writes
``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` beside the weights:
``AutoTokenizer.from_pretrained(folder)`` and ``python -m hyper_parallel.generate folder`` then need nothing
else. A Hugging Face tokenizer's ``tokenizer.json`` is copied as it is; its ``tokenizer_config.json`` gets
the config's token overrides, so the folder encodes exactly as training did: when the file's own
post-processor does not add what training added in front of a text (its BOS when ``add_bos``, nothing
otherwise), the copy gets a post-processor that does (``with_training_specials``), and
``tokenizer_config.json`` says ``add_bos_token`` / ``add_eos_token`` to match, so transformers'
``AutoTokenizer`` gives training's ids whatever tokenizer class the file names.

The byte tokenizer has no files, so an equivalent ``tokenizer.json`` is built with the ``tokenizers``
library: byte-level pre-tokenization (every byte becomes one character of GPT-2's byte alphabet, with
no regex split and no prefix space), a BPE model without merges whose vocabulary gives each byte's
character the byte's value as id, the byte-level decoder, and ``<s>``, ``</s>``, ``<pad>`` as special
tokens 256, 257 and 258. Written in a text, ``<s>``, ``</s>`` and ``<pad>`` are those special tokens
(as in every Hugging Face tokenizer, whose chat templates write them so), where ``ByteTokenizer.encode``
keeps them as their bytes: a prompt holding them is the one text the two encode differently. Encoding a
prompt adds ``<s>`` when the config's ``add_bos`` is set (the post-processor) but never ``</s>``: a prompt
is meant to be continued.

``tokenizer_config.json`` carries the ``chat_template`` training rendered conversations with
(``training_chat_template``: the configured preset or file, the tokenizer's own, or the built-in format as
Jinja), so ``apply_chat_template`` on the export gives the ids the prepared chat data holds.

Imports ``tokenizers`` (not torch); called by the export only.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from hyper_parallel._json import loads

if TYPE_CHECKING:
    from hyper_parallel.components.tokenizer import Tokenizer

__all__ = [
    "TOKENIZER_FILES",
    "byte_alphabet",
    "byte_tokenizer_json",
    "special_token_ids",
    "tokenizer_files",
    "training_chat_template",
    "with_training_specials",
]

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
            "clean_up_tokenization_spaces": False,
            "chat_template": training_chat_template(cfg, None),
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
    from hyper_parallel.components.tokenizer._runtime import (
        build_hf_tokenizer,
        locate_tokenizer,
        read_tokenizer_config,
    )

    where = cfg.path if cfg.path is not None else weights_path
    if where is None:
        raise ValueError("tokenizer.path is null and the model has no weights_path to read a tokenizer from")
    try:
        file, config_file = locate_tokenizer(where)
        built = build_hf_tokenizer(cfg, weights_path)
        known = built.bos_token is not None and built.bos_id is not None
        bos = (str(built.bos_token), int(built.bos_id or 0)) if cfg.add_bos and known else None
        files = {"tokenizer.json": with_training_specials(file.read_bytes(), bos)}
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
    saved["chat_template"] = training_chat_template(cfg, built.chat_template)
    # A prompt is encoded as training encoded a document's start: BOS as configured, never EOS.
    saved["add_bos_token"] = bos is not None
    saved["add_eos_token"] = False
    files["tokenizer_config.json"] = _json(saved)
    files["special_tokens_map.json"] = _json(special_map)
    return files


def training_chat_template(cfg: Tokenizer.Config, own: str | None) -> str:
    """The chat template training rendered conversations with, as Jinja: the configured one (a preset or
    a file), else the tokenizer's own (``own``), else the built-in format (``builtin_template``)."""
    from hyper_parallel.components.tokenizer.chat_templates import builtin_template

    configured = cfg.chat_template_text()
    if configured is not None:
        return configured
    return own if own is not None else builtin_template(add_bos=cfg.add_bos)


def with_training_specials(tokenizer_json: bytes, bos: tuple[str, int] | None) -> bytes:
    """``tokenizer_json`` whose encoding adds ``bos`` (``(token, id)``; None: nothing) in front of a text.

    Training adds BOS itself (``add_bos``) and encodes without the file's post-processor, so a file whose
    post-processor adds nothing (most BPE files) would give ``AutoTokenizer`` other ids than training had.
    Probed on a text: a file that already adds exactly ``bos`` is returned as it is; one adding nothing
    keeps its post-processor (for offsets) followed by a template adding ``bos``; one adding anything else
    (another token, an EOS) gets the template alone. ``ValueError`` when the file cannot be read.
    """
    from tokenizers import Tokenizer, processors

    try:
        tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    except Exception as exc:  # the library raises a bare Exception for any unreadable file
        raise ValueError(f"not a tokenizer file the tokenizers library reads: {exc}") from None
    probe = "a"
    plain = tokenizer.encode(probe, add_special_tokens=False).ids
    full = tokenizer.encode(probe).ids
    head = [bos[1]] if bos is not None else []
    if full == [*head, *plain]:
        return tokenizer_json
    if bos is None:
        template = processors.TemplateProcessing(single="$A", pair="$A $B")
    else:
        template = processors.TemplateProcessing(
            single=f"{bos[0]} $A", pair=f"{bos[0]} $A $B", special_tokens=[bos]
        )
    existing = tokenizer.post_processor
    if existing is not None and full == plain:
        tokenizer.post_processor = processors.Sequence([existing, template])
    else:
        tokenizer.post_processor = template
    return str(tokenizer.to_str(pretty=True)).encode("utf-8") + b"\n"


def special_token_ids(cfg: Tokenizer.Config, weights_path: str | None) -> dict[str, int]:
    """``bos_token_id`` / ``eos_token_id`` / ``pad_token_id`` of the built tokenizer (those it has).

    What ``config.json`` and ``generation_config.json`` carry, so that ``generate()`` stops at the
    end-of-text token training appended. ``ValueError`` (one line) when the files cannot be read.
    """
    from hyper_parallel.components.tokenizer import ByteTokenizer, HuggingFaceTokenizer

    if not isinstance(cfg, (ByteTokenizer.Config, HuggingFaceTokenizer.Config)):
        raise NotImplementedError(f"{type(cfg).__qualname__} has no special ids to write")
    built = cfg.build(weights_path)
    ids = {"bos_token_id": built.bos_id, "eos_token_id": built.eos_id, "pad_token_id": built.pad_id}
    return {key: int(value) for key, value in ids.items() if value is not None}
