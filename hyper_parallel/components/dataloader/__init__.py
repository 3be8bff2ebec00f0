"""Data loading configuration: the type of the root ``dataloader`` field, and the trainer's request.

The ``Config`` classes describe where the training text comes from and how batches are loaded; they hold
validated settings and never read the data files. ``LoaderRequest`` is what the trainer knows that a data
loader needs (tokenizer, data-parallel coordinates, the training shapes, the model's input layout): one
record handed to ``DataLoader.Config.build`` and to the validator's loader.

The ``dataset`` section is one class per source (``sources``: ``source: jsonl`` is a ``JsonlSource``),
each with the fields it reads and the methods for what it does, so nothing here or above asks which
source a section is. The runtime lives in the private modules beside them, one job each: ``_sources``
reads documents, ``_tokenizing`` encodes them (shared over a process group), ``_corpus`` cuts packed or
padded samples from token arrays (in memory, or memory-mapped by ``_prepared`` from folders ``python -m
hyper_parallel.data prepare`` wrote; ``_chat`` encodes the ``chat`` source's files in memory with
prepare's own functions), ``_samples`` makes the samples of the text, chat, generated and image sources
(whole-conversation rows, their over-long conversations refused or said by ``_overlong``; captioned images
from ``_images``, conversations from ``_image_chat``), ``_order`` computes the sample order (shuffle,
blending), ``_loader`` deals and resumes.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from hyper_parallel.components.dataloader.sources import (
    ChatSource,
    DatasetConfig,
    ImageChatSource,
    JsonlSource,
    NoSource,
    PythonDocsSource,
    ShapesSource,
    SyntheticSource,
    TextSource,
    TokenizedSource,
)
from hyper_parallel.config_base import ConfigBase, config_class

if TYPE_CHECKING:  # what ``build`` returns, named here for the packages that build loaders
    from hyper_parallel.components.dataloader._loader import ResumableLoader as ResumableLoader

__all__ = [
    "ChatSource",
    "DataLoader",
    "DatasetConfig",
    "ImageChatSource",
    "JsonlSource",
    "LoaderRequest",
    "NoSource",
    "PythonDocsSource",
    "ShapesSource",
    "SyntheticSource",
    "TextDataLoader",
    "TextSource",
    "TokenizedSource",
]


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
    """Base of data loaders: holds ``Config`` for the root ``dataloader`` field."""

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
            default=attrs.Factory(NoSource),
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
            return self.dataset.loader(
                request, shuffle=self.shuffle, drop_last=self.drop_last, infinite=True, workers=self
            )
