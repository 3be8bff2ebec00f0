"""Tokenizer configuration: the type of the root ``tokenizer`` field.

A tokenizer is chosen in YAML by ``_target_`` (for example
``hyper_parallel.components.tokenizer.HuggingFaceTokenizer.Config``); the resolver only builds the frozen
``Config``. Loading the tokenizer files happens later, at run time, so nothing here touches the filesystem.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import attrs

if TYPE_CHECKING:
    from hyper_parallel.runtime.tokenizer import HFTokenizer

__all__ = ["HuggingFaceTokenizer", "Tokenizer"]

_optional_nonempty = attrs.validators.optional(attrs.validators.min_len(1))


class Tokenizer:
    """Base of tokenizers: holds ``Config`` for the root ``tokenizer`` field."""

    @attrs.frozen(kw_only=True)
    class Config:
        """Options every tokenizer understands."""

        path: str | None = attrs.field(
            default=None,
            validator=_optional_nonempty,
            metadata={
                "help": "Local directory or file holding the tokenizer; null uses the model's weights_path."
            },
        )
        add_bos: bool = attrs.field(
            default=True,
            metadata={"help": "Prepend the beginning-of-sequence token to every encoded document."},
        )
        add_eos: bool = attrs.field(
            default=True,
            metadata={"help": "Append the end-of-sequence token to every encoded document."},
        )

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)`` for inconsistent settings; tokenizer options have none."""
            yield from ()

        def build(self, weights_path: str | None = None) -> Any:
            """The tokenizer at ``path`` (or ``weights_path`` when null); subclasses implement it."""
            raise NotImplementedError(f"{type(self).__qualname__} cannot build a tokenizer; use a subclass")


class HuggingFaceTokenizer(Tokenizer):
    """A tokenizer stored in the Hugging Face ``tokenizer.json`` / ``tokenizer_config.json`` format."""

    @attrs.frozen(kw_only=True)
    class Config(Tokenizer.Config):
        """Options of a Hugging Face tokenizer; token overrides default to the tokenizer's own tokens."""

        bos_token: str | None = attrs.field(
            default=None,
            validator=_optional_nonempty,
            metadata={"help": "Beginning-of-sequence token text; null keeps the tokenizer's own."},
        )
        eos_token: str | None = attrs.field(
            default=None,
            validator=_optional_nonempty,
            metadata={"help": "End-of-sequence token text; null keeps the tokenizer's own."},
        )
        pad_token: str | None = attrs.field(
            default=None,
            validator=_optional_nonempty,
            metadata={"help": "Padding token text; null keeps the tokenizer's own, or falls back to eos."},
        )
        padding_side: Literal["left", "right"] = attrs.field(
            default="right",
            metadata={
                "help": "Side on which batches are padded: 'right' for training, 'left' for generation."
            },
        )
        use_fast: bool = attrs.field(
            default=True,
            metadata={"help": "Use the Rust ('fast') tokenizer implementation when it is available."},
        )
        model_max_length: int | None = attrs.field(
            default=None,
            validator=attrs.validators.optional(attrs.validators.gt(0)),
            metadata={
                "help": "Longest input in tokens the tokenizer accepts; null keeps the tokenizer's own."
            },
        )

        def build(self, weights_path: str | None = None) -> "HFTokenizer":
            """Load the local ``tokenizer.json`` at ``path`` (a file or a folder holding it).

            When ``path`` is null, ``weights_path`` (the model's) is used. Special tokens come from this
            config, else from ``tokenizer_config.json`` beside the file; pad falls back to eos. ``use_fast``
            is informational: the ``tokenizers`` library is the fast implementation.
            """
            from hyper_parallel.runtime.tokenizer import build_hf_tokenizer

            return build_hf_tokenizer(self, weights_path)
