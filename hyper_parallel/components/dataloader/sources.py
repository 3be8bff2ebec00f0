"""Dataset sources: one class per ``source:`` value, each holding the fields it reads and doing what it does.

A ``dataset`` section names its source with ``source: jsonl`` (``text``, ``tokenized``, ...); the resolver
reads that key and structures the section as that source's class (:class:`DatasetConfig` is their base, the
type of every ``dataset`` field, and :data:`DatasetConfig.__variants__` the table it looks in). So a
source's fields, checks and behaviour live in one class: what it checks at resolve time (``cross_check``),
before anything is built (``check_files``), at ``--dry-run`` (``check_encoded``), and the samples it makes
(``samples``). Callers ask the section, never which source it is; a new source is one class here plus its
runtime.

A field of another source is refused at resolve time with the message it always got (``text_field`` "is
only read when source is 'jsonl'"), unless it holds that field's default: a dump written when every
section listed every source's fields still loads (the default is dropped, as it was never read).

Torch-free: the runtime (reading files, tokenizing, images) is in the private modules beside this one,
imported inside the methods.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias

import attrs

from hyper_parallel._checks import quote, said
from hyper_parallel.data.overlong import Overlong
from hyper_parallel.models.qwen3_5.images import MAX_PIXELS, MIN_PIXELS

if TYPE_CHECKING:
    from hyper_parallel.components.dataloader import DataLoader, LoaderRequest
    from hyper_parallel.components.dataloader._corpus import Samples
    from hyper_parallel.components.dataloader._loader import ResumableLoader

__all__ = [
    "ChatSource",
    "DatasetConfig",
    "ImageChatSource",
    "JsonlSource",
    "NoSource",
    "PythonDocsSource",
    "ShapesSource",
    "SyntheticSource",
    "TextSource",
    "TokenizedSource",
]

Issues = Iterator[tuple[str, str]]
#: What ``source:`` may say; each class takes only its own value (its validator), so ``--help`` and an
#: override of ``dataset.source`` offer every source whichever one a section holds.
Source: TypeAlias = (
    Literal["jsonl", "text", "tokenized", "chat", "python_docs", "synthetic", "shapes", "image_chat"] | None
)

_SOURCE_HELP = {
    "help": "Data format, required to train: 'jsonl' (one JSON object per line), 'text' (plain "
    "text files), 'tokenized' (folders written by python -m hyper_parallel.data prepare, "
    "memory-mapped), 'chat' (JSON lines or Parquet of chat messages, rendered and encoded at launch as "
    "prepare --format chat would: small sets), 'python_docs' (docstrings of the Python standard "
    "library: real text, no files), 'synthetic' (random tokens, for smoke tests and benchmarks), "
    "'shapes' (generated images of coloured shapes with captions, for vision-language models) or "
    "'image_chat' (JSON lines of chat messages holding image paths, for vision-language models); null "
    "names no data."
}


# Each field is written once, here, and listed by every source that reads it (in this order, the order a
# dump writes them in).


def _only(tag: str | None) -> Any:
    """The validator of a source's ``source`` field: the value naming that class, no other."""
    return attrs.validators.in_((tag,))


def _paths() -> Any:
    return attrs.field(
        default=(),
        validator=attrs.validators.deep_iterable(member_validator=attrs.validators.min_len(1)),
        metadata={"help": "Data files or directories to read, in order."},
    )


def _seed() -> Any:
    return attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.ge(0)),
        metadata={"help": "Seed of the sample shuffle order; null uses training.seed."},
    )


def _pack_sequences() -> Any:
    return attrs.field(
        default=True,
        metadata={"help": "Concatenate documents and cut them into full seq_len samples instead of padding."},
    )


def _document_masking() -> Any:
    return attrs.field(
        default=True,
        metadata={
            "help": "With pack_sequences, batches carry document_ids so a token attends only to its own "
            "document (positions and recurrent state restart at each one); false lets documents see "
            "the ones packed before them."
        },
    )


def _max_samples() -> Any:
    return attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.gt(0)),
        metadata={"help": "Stop after this many samples per epoch; null reads the whole dataset."},
    )


#: Help of the ``overlong`` field (written as ``attrs.field(default="error", metadata=...)`` per source).
_OVERLONG_HELP = {
    "help": "A conversation longer than training.seq_len (chat data: packed whole, it fits no row): "
    "'error' refuses the data naming its record, 'drop' leaves it out, 'truncate' keeps its first "
    "seq_len tokens (both say how many)."
}


def _num_samples() -> Any:
    return attrs.field(
        default=10_000,
        validator=attrs.validators.gt(0),
        metadata={"help": "Number of samples generated when source is 'synthetic' or 'shapes'."},
    )


class DatasetConfig:
    """A nested ``dataset`` section: which text to read and how to turn it into training samples.

    The base of the sources, and the type of every ``dataset`` field: the resolver picks the class whose
    ``source`` the section names (:data:`__variants__`, looked up by ``__variant_key__``). What a caller
    may ask of any section is declared here, with the answer of a source that has nothing to say.
    """

    #: The key whose value names the source, and the sources (the first is the one without the key).
    __variant_key__: ClassVar[str] = "source"
    __variants__: ClassVar[tuple[type["DatasetConfig"], ...]] = ()

    #: Whether the section names data to read (False only for ``source: null``).
    names_data: ClassVar[bool] = True
    #: What kind of image data it is (``"image-caption data"``), or None for text: only a
    #: vision-language model and ``train_vl`` take images.
    image_data: ClassVar[str | None] = None
    #: Whether its samples are drawn from the seed (then the seed is read even without a shuffle).
    generated: ClassVar[bool] = False

    if TYPE_CHECKING:  # every source's first field, and the sample options every source has
        source: str | None
        seed: int | None
        max_samples: int | None

    def __new__(cls, *args: Any, **kwargs: Any) -> "DatasetConfig":
        if cls is DatasetConfig:  # what used to be built with source="jsonl" is JsonlSource now
            names = ", ".join(v.__name__ for v in DatasetConfig.__variants__)
            raise TypeError(f"DatasetConfig is the base of the dataset sources: build one of {names}")
        return super().__new__(cls)

    @classmethod
    def tag(cls) -> str | None:
        """The ``source:`` value naming this class."""
        return attrs.fields_dict(cls)["source"].default  # type: ignore[arg-type, no-any-return]

    @classmethod
    def refuse(cls, name: str, value: object) -> tuple[str, str]:
        """``(field path, message)`` refusing field ``name`` of another source, set to ``value`` (not that
        field's default): the sources that read it are named, so the user knows which one was meant."""
        owners = [
            repr(v.tag())
            for v in DatasetConfig.__variants__
            if v.names_data and name in attrs.fields_dict(v)  # type: ignore[arg-type]
        ]
        named = f"{', '.join(owners[:-1])} or {owners[-1]}" if len(owners) > 1 else owners[0]
        return name, f"is only read when source is {named} (source is {cls.tag()!r}); leave it out"

    def cross_check(self) -> Issues:
        """Yield ``(field path, message)``: the source's own rules on its fields."""
        return iter(())

    def unread_seed(self, shuffle: bool) -> Issues:
        """``("seed", message)`` when ``seed`` is set but nothing reads it: no shuffle, no generated data."""
        if self.seed is not None and not shuffle and not self.generated:
            yield (
                "seed",
                "is only read to shuffle or to generate synthetic data, and neither happens; set it to null",
            )

    def check_files(self) -> None:
        """Refuse, before anything is built, files that cannot be read as configured (an
        ``InputFileError``, ``FILE:LINE: problem``, exit status 2); a source without files has none."""

    def check_encoded(self, tokenizer: Any, model_args: Any, seq_len: int) -> None:
        """``--dry-run``'s check that the loader can encode this data with ``tokenizer`` for the model of
        ``model_args`` within ``seq_len`` (prepared folders against the tokenizer, conversations against
        the vision tower); raises as the build would."""

    def tokenizer_issues(self, tokenizer: Any) -> Iterator[str]:
        """What this data needs of a built tokenizer that ``tokenizer`` lacks (messages about it)."""
        return iter(())

    def separates_documents(self) -> bool:
        """Whether samples pack documents of text separated by the tokenizer's EOS."""
        return False

    def samples_per_epoch(self, seq_len: int) -> int | None:
        """Samples an epoch of this data holds at ``seq_len``, known before launch from what the dry-run
        may open without torch (a prepared folder's manifest and offsets); None where only the loader knows
        (an in-memory source is tokenized at launch). ``--dry-run`` says the epochs of a run by it."""
        return None

    def mixture(self) -> tuple[tuple[float, ...] | None, tuple[str, ...]]:
        """``(weights, names)`` of the sources blended into the sample order (``(None, ())``: one source)."""
        return None, ()

    def files(self) -> tuple[str, ...]:
        """The paths this data is read from (none for data that is generated or built in)."""
        return ()

    def held_out(self) -> "tuple[DatasetConfig, str] | None":
        """The held-out split of this data and words for how much it is, or None without one."""
        return None

    def in_file_order(self) -> "DatasetConfig":
        """This data as validation reads it: unshuffled, so the seed stays only where it draws samples."""
        return self if self.generated else attrs.evolve(self, seed=None)  # type: ignore[misc]

    def pixel_bounds(self) -> tuple[int, int]:
        """``(min_pixels, max_pixels)`` images are resized within: the image processor's defaults unless
        the data sets them (the export writes them, ``generate --image`` reads them back)."""
        return MIN_PIXELS, MAX_PIXELS

    def samples(self, request: "LoaderRequest", *, seed: int, max_samples: int | None) -> "Samples":
        """The samples of this data for ``request`` (tokenizer, ``seq_len``, the model's layout); ``seed``
        draws generated data, ``max_samples`` (None: all) keeps the first ones."""
        raise ValueError("the dataset names no source")

    def loader(
        self,
        request: "LoaderRequest",
        *,
        shuffle: bool,
        drop_last: bool,
        infinite: bool,
        max_samples: int | None = None,
        workers: "DataLoader.Config | None" = None,
    ) -> "ResumableLoader":
        """The batches of this data for the request's rank (what a data loader or a validator serves):
        ``max_samples`` caps the samples below ``self.max_samples``, ``workers`` (a data loader's Config)
        gives the worker-process and pinning options (None: loaded in this process)."""
        from hyper_parallel.components.dataloader._loader import build_loader

        return build_loader(
            self,
            request,
            shuffle=shuffle,
            drop_last=drop_last,
            infinite=infinite,
            max_samples=max_samples,
            workers=workers,
        )


class _Files(DatasetConfig):
    """Data read from ``paths``: a source that reads files needs some (its default lists none, so the
    section must name them), and they are the files it is read from."""

    paths: tuple[str, ...]

    def cross_check(self) -> Issues:
        if not self.paths:
            yield "paths", f"must list at least one file or directory when source is {self.source!r}"

    def files(self) -> tuple[str, ...]:
        return self.paths


class _Documents(DatasetConfig):
    """Text documents, tokenized here and packed (EOS between them) or padded one per sample."""

    pack_sequences: bool
    document_masking: bool

    def separates_documents(self) -> bool:
        return self.pack_sequences

    def tokenizer_issues(self, tokenizer: Any) -> Iterator[str]:
        if self.pack_sequences and tokenizer.eos_id is None:
            yield (
                "has no eos token, which dataloader.dataset.pack_sequences needs to separate documents; set "
                "tokenizer.eos_token to one of its tokens, or pack_sequences to false"
            )

    def documents(self) -> Iterator[str]:
        """The documents, in file (or listed) order."""
        raise NotImplementedError

    def samples(self, request: "LoaderRequest", *, seed: int, max_samples: int | None) -> "Samples":
        from hyper_parallel.components.dataloader._samples import document_samples

        return document_samples(
            self.documents(),
            request,
            pack=self.pack_sequences,
            document_masking=self.document_masking,
            max_samples=max_samples,
        )


class _NoFiles(DatasetConfig):
    """Data without files: ``paths`` is refused in words that name the sources that read files."""

    @classmethod
    def refuse(cls, name: str, value: object) -> tuple[str, str]:
        if name == "paths":
            return name, f"must be empty when source is {cls.tag()!r} (or set source to 'jsonl' or 'text')"
        return super().refuse(name, value)


@attrs.frozen(kw_only=True, slots=False)
class NoSource(DatasetConfig):
    """``source: null``: a section that names no data (a validator that is off, a config only exported
    from). Allowed here; what trains on it refuses it (:func:`hyper_parallel.trainer.rules.data_issues`).

    It keeps the sample options every text source shares, so that a section whose source is missing is
    told that first ("names no training data"), not that its ``seed`` is read by no source.
    """

    names_data: ClassVar[bool] = False

    source: Source = attrs.field(default=None, validator=_only(None), metadata=_SOURCE_HELP)
    seed: int | None = _seed()
    pack_sequences: bool = _pack_sequences()
    document_masking: bool = _document_masking()
    max_samples: int | None = _max_samples()

    @classmethod
    def refuse(cls, name: str, value: object) -> tuple[str, str]:
        if name == "paths":
            return "source", f"must name the format of paths {list(value)}: 'jsonl', 'text' or 'tokenized'"  # type: ignore[call-overload]
        return super().refuse(name, value)


@attrs.frozen(kw_only=True, slots=False)
class JsonlSource(_Files, _Documents):
    """``source: jsonl``: one JSON object per line, the document is its ``text_field``."""

    source: Source = attrs.field(default="jsonl", validator=_only("jsonl"), metadata=_SOURCE_HELP)
    paths: tuple[str, ...] = _paths()
    text_field: str = attrs.field(
        default="text",
        validator=attrs.validators.min_len(1),
        metadata={"help": "Key of the text in each JSON object (used when source is 'jsonl')."},
    )
    seed: int | None = _seed()
    pack_sequences: bool = _pack_sequences()
    document_masking: bool = _document_masking()
    max_samples: int | None = _max_samples()

    def check_files(self) -> None:
        """Every path exists, a folder holds ``*.jsonl`` files, the first record of each file is a JSON
        object with ``text_field``, and some file holds a record."""
        from hyper_parallel.components.dataloader._sources import check_jsonl

        check_jsonl(self.paths, self.text_field)

    def documents(self) -> Iterator[str]:
        from hyper_parallel.components.dataloader._sources import jsonl_documents

        return jsonl_documents(self.paths, self.text_field)


@attrs.frozen(kw_only=True, slots=False)
class TextSource(_Files, _Documents):
    """``source: text``: each file (``*.txt`` under a folder) is one document."""

    source: Source = attrs.field(default="text", validator=_only("text"), metadata=_SOURCE_HELP)
    paths: tuple[str, ...] = _paths()
    seed: int | None = _seed()
    pack_sequences: bool = _pack_sequences()
    document_masking: bool = _document_masking()
    max_samples: int | None = _max_samples()

    def check_files(self) -> None:
        """Every path exists, a folder holds ``*.txt`` files, and not every file is empty."""
        from hyper_parallel.components.dataloader._sources import check_text

        check_text(self.paths)

    def documents(self) -> Iterator[str]:
        from hyper_parallel.components.dataloader._sources import text_documents

        return text_documents(self.paths)


@attrs.frozen(kw_only=True, slots=False)
class TokenizedSource(_Files):
    """``source: tokenized``: folders written by ``python -m hyper_parallel.data prepare``, memory-mapped;
    several folders are blended by ``weights``, and each may set apart a held-out fraction."""

    source: Source = attrs.field(default="tokenized", validator=_only("tokenized"), metadata=_SOURCE_HELP)
    paths: tuple[str, ...] = _paths()
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
    seed: int | None = _seed()
    pack_sequences: bool = _pack_sequences()
    document_masking: bool = _document_masking()
    max_samples: int | None = _max_samples()
    overlong: Overlong = attrs.field(default="error", metadata=_OVERLONG_HELP)

    def cross_check(self) -> Issues:
        """Paths, and mixture and held-out options consistent with them."""
        yield from super().cross_check()
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

    def mixture(self) -> tuple[tuple[float, ...] | None, tuple[str, ...]]:
        return self.weights, self.paths

    def held_out(self) -> tuple[DatasetConfig, str] | None:
        if self.holdout_fraction == 0.0:
            return None
        share = f"the last {self.holdout_fraction:g} of each folder's documents"
        return attrs.evolve(self, split="holdout"), share

    def selected(self, documents: int) -> tuple[int, int]:
        """``(first, count)``: the documents of a folder of ``documents`` that ``split`` reads."""
        held = int(documents * self.holdout_fraction)
        return (documents - held, held) if self.split == "holdout" else (0, documents - held)

    def samples_per_epoch(self, seq_len: int) -> int | None:
        """Windows of ``seq_len`` tokens of each folder's selected documents (packed) or one sample per
        document (unpacked), each capped at ``max_samples``, summed over the folders; None for chat
        folders, whose rows the loader fills with whole conversations."""
        from hyper_parallel.data.shards import open_prepared

        total = 0
        for path in self.paths:
            prepared = open_prepared(path)
            if prepared.chat:
                return None
            first, count = self.selected(prepared.documents)
            if self.pack_sequences:
                samples = _document_tokens(prepared.shards, first, count) // seq_len
            else:
                samples = count
            total += samples if self.max_samples is None else min(samples, self.max_samples)
        return total

    def check_encoded(self, tokenizer: Any, model_args: Any, seq_len: int) -> None:
        """Each folder's manifest, shards and tokenizer fingerprint (a ``PreparedDataError``), and with
        ``overlong: error`` no conversation of chat data longer than ``seq_len`` (an ``InputFileError``
        at its record)."""
        from hyper_parallel.components.dataloader._overlong import refuse_overlong
        from hyper_parallel.components.dataloader._prepared_check import input_names, open_for_training
        from hyper_parallel.data.shards import tokenizer_fingerprint

        fingerprint = tokenizer_fingerprint(tokenizer)
        for path in self.paths:
            prepared = open_for_training(path, fingerprint, getattr(tokenizer, "chat_template", None))
            if not prepared.chat or self.overlong != "error":
                continue
            first, count = self.selected(prepared.documents)
            names = input_names(prepared.manifest)
            refuse_overlong(prepared.shards, seq_len, names=names, label=path, first=first, count=count)

    def samples(self, request: "LoaderRequest", *, seed: int, max_samples: int | None) -> "Samples":
        from hyper_parallel.components.dataloader._prepared import prepared_samples

        return prepared_samples(self, request, max_samples=max_samples)


def _document_tokens(shards: Any, first: int, count: int) -> int:
    """Tokens of documents ``[first, first + count)`` of a prepared folder's ``shards`` (their offsets)."""

    def start(doc: int) -> int:
        before = 0
        for shard in shards:
            if doc < shard.documents:
                return before + int(shard.offsets[doc])
            doc -= shard.documents
            before += int(shard.tokens.shape[0])
        return before

    return start(first + count) - start(first)


@attrs.frozen(kw_only=True, slots=False)
class ChatSource(_Files):
    """``source: chat``: chat records (``{"messages": [...]}`` JSON lines, or a Parquet ``messages``
    column) named directly, rendered and encoded at launch exactly as ``prepare --format chat`` would,
    so a first fine-tune needs no prepare; each conversation is one document, packed whole."""

    source: Source = attrs.field(default="chat", validator=_only("chat"), metadata=_SOURCE_HELP)
    paths: tuple[str, ...] = _paths()
    seed: int | None = _seed()
    pack_sequences: bool = _pack_sequences()
    document_masking: bool = _document_masking()
    max_samples: int | None = _max_samples()
    overlong: Overlong = attrs.field(default="error", metadata=_OVERLONG_HELP)
    train_on: tuple[str, ...] = attrs.field(
        default=("assistant",),
        validator=attrs.validators.min_len(1),
        metadata={
            "help": "Roles whose turns carry labels (prepare's --train-on); the others are context only. "
            "Only for source 'chat'."
        },
    )
    drop_unlabeled: bool = attrs.field(
        default=False,
        metadata={
            "help": "Leave out conversations with no token to train on instead of refusing them "
            "(prepare's --drop-unlabeled). Only for source 'chat'."
        },
    )

    def check_files(self) -> None:
        """Every path exists and holds chat files, and the first record of each is a conversation."""
        from hyper_parallel.components.dataloader._chat import check_chat_files

        check_chat_files(self)

    def check_encoded(self, tokenizer: Any, model_args: Any, seq_len: int) -> None:
        """Every conversation encoded as the launch will, and with ``overlong: error`` none longer than
        ``seq_len`` (an ``InputFileError`` at its record's ``FILE:LINE``)."""
        from hyper_parallel.components.dataloader._chat import chat_shards
        from hyper_parallel.components.dataloader._overlong import refuse_overlong

        arrays, names = chat_shards(self, tokenizer)
        if self.overlong == "error":
            refuse_overlong(arrays, seq_len, names=names, label="chat data")

    def samples(self, request: "LoaderRequest", *, seed: int, max_samples: int | None) -> "Samples":
        from hyper_parallel.components.dataloader._chat import chat_shards
        from hyper_parallel.components.dataloader._corpus import Corpus
        from hyper_parallel.components.dataloader._samples import chat_samples

        arrays, names = chat_shards(self, request.tokenizer)
        corpus = Corpus(
            arrays, vocab_size=request.tokenizer.vocab_size, names=names, label=", ".join(self.paths)
        )
        return chat_samples(corpus, self, request, max_samples)


@attrs.frozen(kw_only=True, slots=False)
class PythonDocsSource(_NoFiles, _Documents):
    """``source: python_docs``: the docstrings of a fixed list of standard-library modules (real text on
    every machine, without files or network)."""

    source: Source = attrs.field(default="python_docs", validator=_only("python_docs"), metadata=_SOURCE_HELP)
    seed: int | None = _seed()
    pack_sequences: bool = _pack_sequences()
    document_masking: bool = _document_masking()
    max_samples: int | None = _max_samples()

    def documents(self) -> Iterator[str]:
        from hyper_parallel.components.dataloader._sources import python_docs

        return iter(python_docs())


@attrs.frozen(kw_only=True, slots=False)
class SyntheticSource(_NoFiles):
    """``source: synthetic``: windows of uniform random token ids (for smoke tests and benchmarks)."""

    generated: ClassVar[bool] = True

    source: Source = attrs.field(default="synthetic", validator=_only("synthetic"), metadata=_SOURCE_HELP)
    seed: int | None = _seed()
    max_samples: int | None = _max_samples()
    synthetic_num_samples: int = _num_samples()

    @classmethod
    def refuse(cls, name: str, value: object) -> tuple[str, str]:
        if name == "pack_sequences":
            return name, "must be true when source is 'synthetic': its samples are full windows"
        return super().refuse(name, value)

    def samples(self, request: "LoaderRequest", *, seed: int, max_samples: int | None) -> "Samples":
        from hyper_parallel.components.dataloader._samples import synthetic_samples

        count = self.synthetic_num_samples
        return synthetic_samples(request, seed, count if max_samples is None else min(count, max_samples))


@attrs.frozen(kw_only=True, slots=False)
class ShapesSource(_NoFiles):
    """``source: shapes``: generated images of coloured shapes with captions (vision-language models)."""

    image_data: ClassVar[str | None] = "image-caption data"
    generated: ClassVar[bool] = True

    source: Source = attrs.field(default="shapes", validator=_only("shapes"), metadata=_SOURCE_HELP)
    seed: int | None = _seed()
    max_samples: int | None = _max_samples()
    synthetic_num_samples: int = _num_samples()

    @classmethod
    def refuse(cls, name: str, value: object) -> tuple[str, str]:
        if name == "pack_sequences":
            return (
                name,
                "is not read when source is 'shapes' (each sample is one image and its caption, padded to "
                "seq_len); leave it out",
            )
        return super().refuse(name, value)

    def samples(self, request: "LoaderRequest", *, seed: int, max_samples: int | None) -> "Samples":
        from hyper_parallel.components.dataloader._samples import shapes_samples

        count = self.synthetic_num_samples
        return shapes_samples(request, seed, count if max_samples is None else min(count, max_samples))


@attrs.frozen(kw_only=True, slots=False)
class ImageChatSource(_Files):
    """``source: image_chat``: JSON lines of chat messages holding image paths (vision-language models);
    each conversation is one sample, its images resized within the pixel bounds."""

    image_data: ClassVar[str | None] = "image-text conversations"

    source: Source = attrs.field(default="image_chat", validator=_only("image_chat"), metadata=_SOURCE_HELP)
    paths: tuple[str, ...] = _paths()
    seed: int | None = _seed()
    max_samples: int | None = _max_samples()
    image_min_pixels: int = attrs.field(
        default=MIN_PIXELS,
        validator=[attrs.validators.gt(0), attrs.validators.le(MAX_PIXELS)],
        metadata={
            "help": "Smaller images are scaled up to about this many pixels (aspect kept). Only for "
            "source 'image_chat'."
        },
    )
    image_max_pixels: int = attrs.field(
        default=MAX_PIXELS,
        validator=[attrs.validators.gt(0), attrs.validators.le(MAX_PIXELS)],
        metadata={
            "help": "Larger images are scaled down to at most this many pixels (aspect kept; at most "
            "16,777,216); it bounds the vision tokens per image. Only for source 'image_chat'."
        },
    )

    @classmethod
    def refuse(cls, name: str, value: object) -> tuple[str, str]:
        if name == "pack_sequences":
            return (
                name,
                "is not read when source is 'image_chat' (each conversation is one sample, padded to "
                "seq_len); leave it out",
            )
        return super().refuse(name, value)

    def cross_check(self) -> Issues:
        """Paths, and bounds that leave a range."""
        yield from super().cross_check()
        if self.image_min_pixels > self.image_max_pixels:
            yield (
                "image_min_pixels",
                said(
                    "must be <= ",
                    quote("image_max_pixels", self.image_max_pixels),
                    f", got {self.image_min_pixels}",
                ),
            )

    def pixel_bounds(self) -> tuple[int, int]:
        return self.image_min_pixels, self.image_max_pixels

    def check_files(self) -> None:
        """The first conversations of each file parse, and their images exist and can be opened."""
        from hyper_parallel.components.dataloader._sources import check_image_chat

        check_image_chat(self.paths)

    def tokenizer_issues(self, tokenizer: Any) -> Iterator[str]:
        if getattr(tokenizer, "chat_template", None):
            yield (
                "has a chat_template, and the image_chat source writes conversations in the built-in chat "
                "format only (a template's image tokens are not supported yet); use a tokenizer without one"
            )

    def check_encoded(self, tokenizer: Any, model_args: Any, seq_len: int) -> None:
        """The first conversations of each file encoded as the loader will (within ``seq_len``, no text
        on the image id): the build's own refusals."""
        from hyper_parallel.components.dataloader._image_chat import check_image_chat_encoding

        check_image_chat_encoding(self, tokenizer, model_args, seq_len)

    def samples(self, request: "LoaderRequest", *, seed: int, max_samples: int | None) -> "Samples":
        from hyper_parallel.components.dataloader._samples import image_chat_samples

        return image_chat_samples(self, request, max_samples)


DatasetConfig.__variants__ = (
    NoSource,
    JsonlSource,
    TextSource,
    TokenizedSource,
    ChatSource,
    PythonDocsSource,
    SyntheticSource,
    ShapesSource,
    ImageChatSource,
)
