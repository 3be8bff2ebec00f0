"""How much a ``tokenizer.json``'s normalizer and pre-tokenizer can lengthen text, checked when the tokenizer
is loaded, and how much text one encoding may hold.

A normalizer runs before the model, inside the Rust library: a ``Replace`` of one character by 1 MB made
``prepare`` and ``generate`` ask for 12.6 GB and abort (SIGABRT, exit 134, no message). The growth factor
is read from the normalizer's description (never by running it): a ``Replace`` of a string pattern
multiplies text by at most ``len(content) / len(pattern)``, of a regex (which may match one character,
or none between two) by ``len(content) + 1``; ``Prepend`` by ``len(prepend) + 1`` (once per piece);
Unicode normalizations by their longest expansion (NFD/NFC 4, NFKD/NFKC and a precompiled map 18);
``BertNormalizer`` by 3 (spaces around CJK characters); a ``Sequence`` by the product of its members.
The pre-tokenizer multiplies it again: ``ByteLevel`` writes each UTF-8 byte as a character (4 characters
for one, and a ``Sequence`` of 14 of them made 1,000 characters take 1.3 GB), ``Metaspace`` by 2 (its
replacement and prefix). Above ``MAX_GROWTH`` the tokenizer is refused with the figure. No shipped or
published tokenizer this project reads comes near it (Llama 2's, a ``Prepend`` and a one-character
``Replace``: 2; Qwen's, NFC and ``ByteLevel``: 16).

The factor bounds lengths, not memory: the Rust library holds 15 to 30 bytes per character of normalized
text, for every document its threads encode at once: 100,000 characters grown 1,024 times took 1.9 GB,
eight documents of 16,000 on 8 threads 2.2 GB, and a few MB aborted. One encoding call therefore holds
at most ``MAX_ENCODE_CHARS`` characters times the growth (``HFTokenizer``): a batch is split to fit, and
a single text past it has its normalized and pre-tokenized length measured (in bounded chunks,
``text_problem``) and is refused when that is still past it (a text of 16 million ordinary characters
is not).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_ENCODE_CHARS", "MAX_GROWTH", "normalizer_growth", "pre_tokenizer_growth"]

#: Largest factor a normalizer and pre-tokenizer together may lengthen text by.
MAX_GROWTH = 1024
#: Most characters of text, times its growth, one encoding call holds (at most about 600 MB in the library).
MAX_ENCODE_CHARS = 1 << 24

_UNICODE = {
    "NFD": 4,
    "NFC": 4,
    "NFKD": 18,
    "NFKC": 18,
    "Precompiled": 18,
    "BertNormalizer": 3,
    "ByteLevel": 4,
}
#: Pre-tokenizers that lengthen text: each UTF-8 byte a character, a replacement and a prefix per piece.
_PRE = {"ByteLevel": 4, "Metaspace": 2}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _growth(node: Any, members: str, leaf: Callable[[dict[str, Any]], float], depth: int = 0) -> float:
    """The factor the component described by ``node`` (its JSON) can lengthen a text by: a ``Sequence``
    (its parts under ``members``) multiplies its parts' factors, anything else is ``leaf``'s; an unknown
    shape or a nesting past 32 is unbounded."""
    if not isinstance(node, dict) or depth > 32:
        return 1.0 if node is None else math.inf
    if node.get("type") == "Sequence":
        parts = node.get(members)
        if not isinstance(parts, list):
            return math.inf
        return math.prod(_growth(part, members, leaf, depth + 1) for part in parts)
    return leaf(node)


def _normalizer(node: dict[str, Any]) -> float:
    kind = node.get("type")
    if kind == "Replace":
        found = node.get("pattern")
        pattern: dict[str, Any] = found if isinstance(found, dict) else {}
        content = len(_text(node.get("content")))
        if "String" in pattern:
            return max(1.0, content / max(1, len(_text(pattern["String"]))))
        return float(content + 1)
    if kind == "Prepend":
        return float(len(_text(node.get("prepend"))) + 1)
    return float(_UNICODE.get(str(kind), 1))


def normalizer_growth(node: Any) -> float:
    """The factor the normalizer described by ``node`` (its JSON) can lengthen a text by, at most."""
    return _growth(node, "normalizers", _normalizer)


def pre_tokenizer_growth(node: Any) -> float:
    """The factor the pre-tokenizer described by ``node`` (its JSON) can lengthen a text by, at most."""
    return _growth(node, "pretokenizers", lambda part: float(_PRE.get(str(part.get("type")), 1)))
