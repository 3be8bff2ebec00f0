"""Data loading configuration: the type of the root ``dataloader`` field, and the trainer's request.

The ``Config`` classes describe where the training text comes from and how batches are loaded; they hold
validated settings and never read the data files. ``LoaderRequest`` is what the trainer knows that a data
loader needs (tokenizer, data-parallel coordinates, the training shapes, the model's input layout): one
record handed to ``DataLoader.Config.build`` and to the validator's loader.

The runtime lives in the private modules beside this one, one job each: ``_sources`` reads documents,
``_tokenizing`` encodes them (shared over a process group), ``_corpus`` cuts packed or padded samples from
token arrays (in memory, or memory-mapped by ``_prepared`` from folders ``python -m hyper_parallel.data
prepare`` wrote), ``_samples`` builds each source's samples (also synthetic, captioned images from
``_images``), ``_order`` computes the sample order (shuffle, blending), ``_loader`` deals and resumes.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import attrs

from hyper_parallel._checks import quote, said
from hyper_parallel.config.base import ConfigBase, config_class

if TYPE_CHECKING:
    from hyper_parallel.components.dataloader._loader import ResumableLoader

__all__ = ["DataLoader", "DatasetConfig", "LoaderRequest", "TextDataLoader"]

_FILE_SOURCES = ("jsonl", "text", "tokenized", "image_chat")
_GENERATED_SOURCES = ("synthetic", "shapes")


@attrs.frozen(kw_only=True, slots=False)
class DatasetConfig:
    """A nested ``dataset`` section: which text to read and how to turn it into training samples."""

    source: (
        Literal["jsonl", "text", "tokenized", "python_docs", "synthetic", "shapes", "image_chat"] | None
    ) = attrs.field(
        default=None,
        metadata={
            "help": "Data format, required to train: 'jsonl' (one JSON object per line), 'text' (plain "
            "text files), 'tokenized' (folders written by python -m hyper_parallel.data prepare, "
            "memory-mapped), 'python_docs' (docstrings of the Python standard library: real text, no "
            "files), 'synthetic' (random tokens, for smoke tests and benchmarks), 'shapes' (generated "
            "images of coloured shapes with captions, for vision-language models) or 'image_chat' (JSON "
            "lines of chat messages holding image paths, for vision-language models); null names no data."
        },
    )
    paths: tuple[str, ...] = attrs.field(
        default=(),
        validator=attrs.validators.deep_iterable(member_validator=attrs.validators.min_len(1)),
        metadata={
            "help": "Data files or directories to read, in order; must be empty for 'python_docs', "
            "'synthetic' and 'shapes'."
        },
    )
    weights: tuple[float, ...] | None = attrs.field(
        default=None,
        metadata={
            "help": "Share of each prepared folder of paths in the blended samples (one per path, any "
            "positive scale); null weighs each by its size. Only for source 'tokenized'."
        },
    )
    holdout_fraction: float = attrs.field(
        default=0.0,
        metadata={
            "help": "Fraction of each prepared folder's documents (its last ones) set apart for validation; "
            "training reads the rest. Only for source 'tokenized'."
        },
    )
    split: Literal["train", "holdout"] = attrs.field(
        default="train",
        metadata={
            "help": "'train' reads the documents before the held-out fraction, 'holdout' only those "
            "(a validator's dataset with the training paths and holdout_fraction)."
        },
    )
    text_field: str = attrs.field(
        default="text",
        validator=attrs.validators.min_len(1),
        metadata={"help": "Key of the text in each JSON object (used when source is 'jsonl')."},
    )
    seed: int | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.ge(0)),
        metadata={"help": "Seed of the sample shuffle order; null uses training.seed."},
    )
    pack_sequences: bool = attrs.field(
        default=True,
        metadata={"help": "Concatenate documents and cut them into full seq_len samples instead of padding."},
    )
    document_masking: bool = attrs.field(
        default=True,
        metadata={
            "help": "With pack_sequences, batches carry document_ids so a token attends only to its own "
            "document (positions and recurrent state restart at each one); false lets documents see "
            "the ones packed before them."
        },
    )
    max_samples: int | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.gt(0)),
        metadata={"help": "Stop after this many samples per epoch; null reads the whole dataset."},
    )
    synthetic_num_samples: int = attrs.field(
        default=10_000,
        validator=attrs.validators.gt(0),
        metadata={"help": "Number of samples generated when source is 'synthetic' or 'shapes'."},
    )
    image_min_pixels: int = attrs.field(
        default=65_536,
        validator=attrs.validators.gt(0),
        metadata={
            "help": "Smaller images are scaled up to about this many pixels (aspect kept). Only for "
            "source 'image_chat'."
        },
    )
    image_max_pixels: int = attrs.field(
        default=16_777_216,
        validator=attrs.validators.gt(0),
        metadata={
            "help": "Larger images are scaled down to at most this many pixels (aspect kept); it bounds "
            "the vision tokens per image. Only for source 'image_chat'."
        },
    )

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)``: file sources need paths, the built-in sources take none.

        A section that names no ``source`` is allowed here (a validator that is off, a config only
        exported from); what trains on it refuses it (:func:`hyper_parallel.trainer.rules.trainer_issues`).
        """
        if self.source is None:
            if self.paths:
                yield (
                    "source",
                    f"must name the format of paths {list(self.paths)}: 'jsonl', 'text' or 'tokenized'",
                )
        elif self.source in _FILE_SOURCES and not self.paths:
            yield "paths", f"must list at least one file or directory when source is {self.source!r}"
        elif self.source not in _FILE_SOURCES and self.paths:
            yield (
                "paths",
                f"must be empty when source is {self.source!r} (or set source to 'jsonl' or 'text')",
            )
        yield from self._tokenized_checks()
        defaults = _DATASET_DEFAULTS
        if self.source != "jsonl" and self.text_field != defaults["text_field"]:
            yield (
                "text_field",
                f"is only read when source is 'jsonl' (source is {self.source!r}); leave it out",
            )
        if (
            self.source not in _GENERATED_SOURCES
            and self.synthetic_num_samples != defaults["synthetic_num_samples"]
        ):
            yield (
                "synthetic_num_samples",
                f"is only read when source is 'synthetic' or 'shapes' (source is {self.source!r}); "
                "leave it out",
            )
        if self.source == "synthetic" and not self.pack_sequences:
            yield "pack_sequences", "must be true when source is 'synthetic': its samples are full windows"
        if self.source == "shapes" and not self.pack_sequences:
            yield (
                "pack_sequences",
                "is not read when source is 'shapes' (each sample is one image and its caption, padded to "
                "seq_len); leave it out",
            )
        yield from self._image_chat_checks()

    def _image_chat_checks(self) -> Iterator[tuple[str, str]]:
        """The image bounds are read for ``image_chat`` only, and must leave a range; a conversation is
        one sample, never packed."""
        if self.source != "image_chat":
            for name in ("image_min_pixels", "image_max_pixels"):
                if getattr(self, name) != _DATASET_DEFAULTS[name]:
                    yield (
                        name,
                        f"is only read when source is 'image_chat' (source is {self.source!r}); leave it out",
                    )
            return
        if self.image_min_pixels > self.image_max_pixels:
            yield (
                "image_min_pixels",
                said(
                    "must be <= ",
                    quote("image_max_pixels", self.image_max_pixels),
                    f", got {self.image_min_pixels}",
                ),
            )
        if not self.pack_sequences:
            yield (
                "pack_sequences",
                "is not read when source is 'image_chat' (each conversation is one sample, padded to "
                "seq_len); leave it out",
            )

    def check_files(self) -> None:
        """Refuse, before anything is built, files that cannot be read as configured: a missing path, a
        folder without files of the source, an empty dataset, a first ``jsonl`` record that is not a
        JSON object with ``text_field``, or (``image_chat``) a first conversation that does not parse or
        names an image that is missing or unreadable (an ``InputFileError``, ``FILE:LINE: problem``,
        exit status 2)."""
        from hyper_parallel.components.dataloader._sources import check_files

        check_files(self)

    def _tokenized_checks(self) -> Iterator[tuple[str, str]]:
        """Mixture and held-out options: only for prepared folders, and consistent with ``paths``."""
        if self.source != "tokenized":
            for name in ("weights", "holdout_fraction", "split"):
                if getattr(self, name) != _DATASET_DEFAULTS[name]:
                    yield (
                        name,
                        f"is only read when source is 'tokenized' (source is {self.source!r}); leave it out",
                    )
            return
        if self.weights is not None:
            if len(self.weights) != len(self.paths):
                yield (
                    "weights",
                    f"has {len(self.weights)} value(s) for {len(self.paths)} path(s): give one per path",
                )
            if any(not w > 0 or w == float("inf") for w in self.weights):
                yield "weights", f"must all be positive and finite, got {list(self.weights)}"
        if not 0.0 <= self.holdout_fraction < 1.0:
            yield "holdout_fraction", f"must be in [0, 1), got {self.holdout_fraction}"
        if self.split == "holdout" and self.holdout_fraction == 0.0:
            yield "split", "'holdout' needs holdout_fraction > 0 (the documents it reads)"

    def unread_seed(self, shuffle: bool) -> Iterator[tuple[str, str]]:
        """``("seed", message)`` when ``seed`` is set but nothing reads it: no shuffle, no generated data."""
        if self.seed is not None and not shuffle and self.source not in _GENERATED_SOURCES:
            yield (
                "seed",
                "is only read to shuffle or to generate synthetic data, and neither happens; set it to null",
            )


#: Each ``DatasetConfig`` field's default, which its checks compare with on every resolve.
_DATASET_DEFAULTS = {f.name: f.default for f in attrs.fields(DatasetConfig)}


@attrs.frozen
class LoaderRequest:
    """What the trainer knows that a data loader needs: ``DataLoader.Config.build(request)``.

    ``tokenizer`` is a built tokenizer (``Tokenizer.Config.build()``); the loader serves data-parallel rank
    ``dp_rank`` of ``dp_world_size``. ``seq_len``, ``micro_batch_size`` and ``seed`` come from the
    ``training`` section (``seed`` is used when the dataset sets none); ``ignore_index`` marks labels the
    loss skips. Every member of ``process_group`` (a ``torch.distributed`` group: the whole world, or the
    data-parallel group; a collective call) tokenizes only its share of the documents and receives the
    rest from the others; the batches are the same as without a group. The model's input layout is what
    image data needs: a vision-language trainer passes ``vision`` (the model's vision arguments, e.g.
    ``Qwen3_5VisionArgs``: the patch geometry) and ``image_token_id``; text sources ignore both.

    The first three may be given by position: ``LoaderRequest(tokenizer, dp_rank, dp_world_size, ...)``.
    """

    tokenizer: Any
    dp_rank: int = attrs.field(validator=attrs.validators.ge(0))
    dp_world_size: int = attrs.field(validator=attrs.validators.ge(1))
    seq_len: int = attrs.field(kw_only=True, validator=attrs.validators.ge(1))
    micro_batch_size: int = attrs.field(kw_only=True, validator=attrs.validators.ge(1))
    seed: int = attrs.field(kw_only=True)
    ignore_index: int = attrs.field(default=-100, kw_only=True)
    process_group: Any = attrs.field(default=None, kw_only=True)
    vision: Any = attrs.field(default=None, kw_only=True)
    image_token_id: int | None = attrs.field(default=None, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.dp_rank >= self.dp_world_size:
            raise ValueError(f"dp_rank must be in [0, {self.dp_world_size}), got {self.dp_rank}")


class DataLoader:
    """Base of data loaders: holds ``Config`` for the root ``dataloader`` field.

    A namespace, not an object the trainer builds: it gives the Config its dotted name
    (``DataLoader.Config``, the root field's type and what a ``_target_`` names) and lets an implementation
    subclass both, ``Impl(DataLoader)`` with ``Impl.Config(DataLoader.Config)``.
    """

    @config_class
    class Config(ConfigBase):
        """Worker-process and host-memory options shared by every data loader.

        An implementation's ``build(request: LoaderRequest)`` returns the iterable of batches of the
        request's data-parallel rank.
        """

        #: A base: a config names one of its subclasses as ``_target_``, never this class.
        __abstract__: ClassVar[bool] = True

        num_workers: int = attrs.field(
            default=2,
            validator=attrs.validators.ge(0),
            metadata={"help": "Background worker processes per rank; 0 loads in the training process."},
        )
        pin_memory: bool = attrs.field(
            default=True,
            metadata={
                "help": "Copy batches into page-locked host memory for faster copies to an accelerator "
                "(no effect without one)."
            },
        )
        prefetch_factor: int | None = attrs.field(
            default=None,
            validator=attrs.validators.optional(attrs.validators.ge(1)),
            metadata={
                "help": "Batches each worker loads ahead; null uses the default (needs num_workers > 0)."
            },
        )
        persistent_workers: bool = attrs.field(
            default=False,
            metadata={"help": "Keep worker processes alive between epochs (needs num_workers > 0)."},
        )

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)``: worker options need worker processes."""
            if self.num_workers == 0:
                if self.prefetch_factor is not None:
                    yield "prefetch_factor", "needs num_workers > 0 (num_workers is 0); set it to null"
                if self.persistent_workers:
                    yield "persistent_workers", "needs num_workers > 0 (num_workers is 0); set it to false"


class TextDataLoader(DataLoader):
    """Loads tokenized text for causal language modelling from a nested ``dataset`` section."""

    @config_class
    class Config(DataLoader.Config):
        """A text data loader: the dataset section plus sampling options."""

        dataset: DatasetConfig = attrs.field(
            default=attrs.Factory(DatasetConfig),
            metadata={"help": "The dataset to read (source, files, text field, shuffle seed)."},
        )
        shuffle: bool = attrs.field(
            default=True,
            metadata={"help": "Shuffle the sample order every epoch (seeded by dataset.seed)."},
        )
        drop_last: bool = attrs.field(
            default=True,
            metadata={"help": "Drop the last incomplete batch of an epoch instead of training on it."},
        )

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)``: the shared checks, and a seed nothing would read."""
            yield from super().cross_check()
            for path, message in self.dataset.unread_seed(self.shuffle):
                yield f"dataset.{path}", message

        def build(self, request: LoaderRequest) -> "ResumableLoader":
            """Batches ``{input_ids, labels}`` of ``[micro_batch_size, seq_len]`` for ``request.dp_rank``.

            The ``shapes`` source adds ``pixel_values`` and ``grid_thw`` and needs the request's ``vision``
            and ``image_token_id``; the other sources ignore both.

            Iterates forever (epoch after epoch, reshuffled); ``state_dict`` / ``load_state_dict`` save
            and restore the position. With a ``process_group`` (a collective call on every member) each
            member tokenizes only its share of the documents. Reading, shared tokenizing, packing and
            sharding rules are documented in the private modules of this package; the samples of an
            optimizer step do not depend on the data-parallel size for the same global batch.
            """
            from hyper_parallel.components.dataloader._loader import build_loader

            return build_loader(
                self.dataset,
                request,
                shuffle=self.shuffle,
                drop_last=self.drop_last,
                infinite=True,
                workers=self,
            )
