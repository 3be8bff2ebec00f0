"""Tokenizer configuration: the type of the root ``tokenizer`` field.

A tokenizer is chosen in YAML by ``_target_`` (for example
``hyper_parallel.components.tokenizer.HuggingFaceTokenizer.Config``); the resolver only builds the frozen
``Config``. Loading the tokenizer files happens later, at run time, so nothing here touches the filesystem.

``ByteTokenizer`` needs no files at all (UTF-8 bytes plus three special ids): debug runs and tests train on
any machine without a download. ``Tokenizer.Config.vocab_size()`` and ``needs_files()`` answer, without
reading anything, what the trainer's cross-checks need to know before a run starts.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar, Literal

import attrs

from hyper_parallel.config_base import ConfigBase, config_class
from hyper_parallel.errors import ConfigError, InputFileError, Issue, did_you_mean

if TYPE_CHECKING:
    from hyper_parallel.components.tokenizer._runtime import ByteLevelTokenizer, HFTokenizer

__all__ = ["ByteTokenizer", "HuggingFaceTokenizer", "Tokenizer"]

_optional_nonempty = attrs.validators.optional(attrs.validators.min_len(1))


class Tokenizer:
    """Base of tokenizers: holds ``Config`` for the root ``tokenizer`` field."""

    @config_class
    class Config(ConfigBase):
        """Options every tokenizer understands."""

        #: A base: a config names one of its subclasses as ``_target_``, never this class.
        __abstract__: ClassVar[bool] = True

        path: str | None = attrs.field(
            default=None,
            validator=_optional_nonempty,
            metadata={
                "help": "Directory or file holding the tokenizer, or a Hub id org/name[@revision]; null uses "
                "the model's weights_path."
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
        chat_template: str | None = attrs.field(
            default=None,
            validator=_optional_nonempty,
            metadata={
                "help": "How chats become text: null (the tokenizer's own, else built-in), a preset "
                "(builtin, chatml, llama3) or a Jinja file path."
            },
        )

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)``: a ``chat_template`` neither a preset nor a file path."""
            yield from super().cross_check()
            problem = self._unknown_preset()
            if problem is not None:
                yield "chat_template", problem

        def _unknown_preset(self) -> str | None:
            """Why ``chat_template`` names nothing: neither a preset nor a file path (None when it does)."""
            from hyper_parallel.components.tokenizer.chat_templates import PRESETS, is_template_file

            value = self.chat_template
            if value is None or is_template_file(value) or value in PRESETS:
                return None
            return (
                f"{value!r} is no preset ({', '.join(PRESETS)}) and no path to a Jinja file (a value with a "
                f"'/' or a .jinja suffix){did_you_mean(value, PRESETS)}"
            )

        def chat_template_text(self) -> str | None:
            """The Jinja text ``chat_template`` names (a preset's, or its file's), None when null; a
            ``ConfigError`` for an unknown preset (as at resolve), an ``InputFileError`` naming the file
            when it cannot be read."""
            if self.chat_template is None:
                return None
            from hyper_parallel.components.tokenizer.chat_templates import read_template

            problem = self._unknown_preset()
            if problem is not None:  # a config made despite its errors (the launch's later checks)
                raise ConfigError([Issue("tokenizer.chat_template", problem)])

            try:
                return read_template(self.chat_template, add_bos=self.add_bos)
            except FileNotFoundError:
                problem = "no such chat template file"
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                problem = f"cannot be read as a UTF-8 chat template: {exc}"
            raise InputFileError.at(self.chat_template, problem, "tokenizer.chat_template")

        def vocab_size(self) -> int | None:
            """Number of token ids when the config alone fixes it; None when only the files know."""
            return None

        def needs_files(self) -> bool:
            """Whether ``build`` reads tokenizer files (from ``path``, or the model's ``weights_path``)."""
            return True


class HuggingFaceTokenizer(Tokenizer):
    """A tokenizer stored in the Hugging Face ``tokenizer.json`` / ``tokenizer_config.json`` format."""

    @config_class
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
            metadata={"help": "Use the Rust ('fast') tokenizer implementation (false is not supported yet)."},
        )
        model_max_length: int | None = attrs.field(
            default=None,
            validator=attrs.validators.optional(attrs.validators.gt(0)),
            metadata={
                "help": "Longest input in tokens the tokenizer accepts; null keeps the tokenizer's own."
            },
        )

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)``: the slow Python tokenizers are not supported yet."""
            yield from super().cross_check()
            if not self.use_fast:
                yield (
                    "use_fast",
                    "false is not supported yet: only the Rust 'tokenizers' library is; set it to true",
                )

        def build(self, weights_path: str | None = None) -> "HFTokenizer":
            """Load the ``tokenizer.json`` at ``path`` (a file, a folder holding it, or a Hub id).

            When ``path`` is null, ``weights_path`` (the model's) is used. Special tokens come from this
            config, else from ``tokenizer_config.json`` beside the file; pad falls back to eos.
            ``model_max_length`` (this config's, else the file's) bounds the training ``seq_len``;
            ``padding_side`` is where unpacked samples are padded.
            """
            from hyper_parallel.components.tokenizer._runtime import build_hf_tokenizer

            return build_hf_tokenizer(self, weights_path)


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as token ids 0-255, then BOS 256, EOS 257 and PAD 258: no files, no download.

    Every text round-trips exactly; sequences are about four times longer than a trained tokenizer's,
    which is what a debug model on a CPU can afford.
    """

    VOCAB_SIZE = 259
    """Number of ids: 256 byte values and three special tokens."""

    @config_class
    class Config(Tokenizer.Config):
        """A byte-level tokenizer; ``path`` must stay null since there is nothing to load."""

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)``: a byte tokenizer reads no files, so ``path`` must be null."""
            yield from super().cross_check()
            if self.path is not None:
                yield "path", "must be null: ByteTokenizer reads no files"

        def vocab_size(self) -> int:
            """``ByteTokenizer.VOCAB_SIZE`` (259)."""
            return ByteTokenizer.VOCAB_SIZE

        def needs_files(self) -> bool:
            """False: the vocabulary is the 256 byte values plus three special tokens."""
            return False

        def build(self, weights_path: str | None = None) -> "ByteLevelTokenizer":
            """The byte tokenizer; ``weights_path`` is ignored (nothing is read)."""
            from hyper_parallel.components.tokenizer._runtime import ByteLevelTokenizer

            built = ByteLevelTokenizer(add_bos=self.add_bos, add_eos=self.add_eos)
            built.chat_template = self.chat_template_text()
            return built
