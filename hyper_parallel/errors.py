"""The one exception type of the user's input, and the issues it carries.

Every stage of the config layer (YAML loading, resolving, overrides, dumping) reports problems the same
way: a single :class:`ConfigError` holding every :class:`Issue` found, so a user fixes a file in one pass
instead of one error per run; the runtimes report a wrong file the config names the same way
(:class:`InputFileError`). It sits below the config package, as the runtimes import it: importing a
runtime loads none of the config machinery.
"""

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import attrs

__all__ = [
    "MAX_ECHO",
    "MAX_MESSAGE",
    "MAX_PATH",
    "TOP_LEVEL",
    "ConfigError",
    "ConfigWarning",
    "InputFileError",
    "Issue",
    "TextTooLong",
    "closest",
    "did_you_mean",
    "format_path",
    "override_origin",
    "parse_path",
    "split_path",
    "warning_line",
]

#: Longest echo of user input inside a message; longer text is cut so hostile input cannot flood logs.
MAX_ECHO = 80
#: Longest :attr:`Issue.message` kept; a longer one (say a factory's error quoting a huge value) is cut.
MAX_MESSAGE = 1000
#: Longest :attr:`Issue.path` and :attr:`Issue.location` kept; longer ones are cut in the middle, so the
#: root group and the leaf (or ``LINE:COL``) stay readable.
MAX_PATH = 300

#: The path of the document itself (a problem with its shape, not with one field).
TOP_LEVEL = "top level"

PathPart = str | int


def format_path(parts: Sequence[PathPart]) -> str:
    """Show ``("parallelism", "pp_layer_split", 2)`` as ``parallelism.pp_layer_split[2]``; ``()`` as
    :data:`TOP_LEVEL`."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or TOP_LEVEL


# A name and its indices, in ASCII digits (``\d`` takes other scripts'), at most 9 (``int()`` of thousands of
# digits raises, where the key should be reported as malformed).
_SEGMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)((?:\[[0-9]{1,9}\])*)")
_INDEX = re.compile(r"\[([0-9]{1,9})\]")


@functools.lru_cache(maxsize=4096)  # asked for each override of every call, of the same few keys
def _segment(text: str) -> tuple[PathPart, ...] | None:
    """The one reading of a path segment: ``pp_layer_split[2]`` -> ``("pp_layer_split", 2)``; None when it
    is not a name with indices."""
    match = _SEGMENT.fullmatch(text)
    return None if match is None else (match.group(1), *(int(i) for i in _INDEX.findall(match.group(2))))


def split_path(path: str) -> tuple[PathPart, ...]:
    """The parts :func:`format_path` shows as ``path``: ``parallelism.pp_layer_split[2]`` ->
    ``("parallelism", "pp_layer_split", 2)``; ``""`` and :data:`TOP_LEVEL` -> ``()``; a segment that is
    not a name with indices is kept whole."""
    segments = () if path in ("", TOP_LEVEL) else path.split(".")
    return tuple(part for text in segments for part in (_segment(text) or (text,)))


def parse_path(key: str) -> tuple[PathPart, ...] | None:
    """The path an override key names (:func:`split_path`'s), or None if it is malformed; a leading ``~``
    (a removal, ``~optimizer.betas``) is not part of it."""
    found = [_segment(text) for text in key.removeprefix("~").split(".")]
    return None if None in found else tuple(part for parts in found for part in parts or ())


@functools.lru_cache(maxsize=4096)  # asked for each override of every call, of the same few keys
def override_origin(key: str, command_line: bool) -> str:
    """Where an override came from, as issues name it: the flag ``--optimizer.lr`` on the command line,
    ``overrides['optimizer.lr']`` from the Python API."""
    return f"--{key}" if command_line else f"overrides[{key!r}]"


def warning_line(issue: "Issue") -> str:
    """``LOCATION: warning: PATH: MESSAGE``: a warning placed where compilers put theirs."""
    head = f"{issue.location}: " if issue.location else ""
    return f"{head}warning: {str(issue)[len(head) :]}"


def echo(value: object) -> str:
    """``repr`` of user input, truncated to :data:`MAX_ECHO` characters."""
    text = repr(value)
    if len(text) > MAX_ECHO:
        text = text[: MAX_ECHO - 12] + f"... ({len(text)} chars)"
    return text


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``name``, or None when none is close."""
    if len(name) > 200:
        return None
    import difflib  # only a user's mistake pays for it

    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """A ``"; did you mean 'x'?"`` suffix naming the closest candidate, or ``""`` when none is close."""
    close = closest(name, candidates)
    return f"; did you mean {close!r}?" if close else ""


def _clip_end(text: str) -> str:
    if len(text) <= MAX_MESSAGE:
        return text
    tail = f"... ({len(text)} chars)"
    return text[: MAX_MESSAGE - len(tail)] + tail


def _clip_middle(text: str) -> str:
    if len(text) <= MAX_PATH:
        return text
    half = (MAX_PATH - 3) // 2
    return f"{text[:half]}...{text[len(text) - half :]}"


def _as_parts(parts: Iterable[PathPart]) -> tuple[PathPart, ...]:
    return tuple(parts)


@attrs.frozen
class Issue:
    """One problem in the input: where it is in the config tree, what is wrong, and where it came from."""

    path: str = attrs.field(
        converter=_clip_middle,
        metadata={
            "help": "Dotted path of the offending field; 'top level' for the document itself, '' for a "
            "problem outside the config (a command-line option, a file that cannot be read); cut to MAX_PATH."
        },
    )
    message: str = attrs.field(
        converter=_clip_end, metadata={"help": "What was expected and what was found (cut to MAX_MESSAGE)."}
    )
    location: str | None = attrs.field(
        default=None,
        converter=attrs.converters.optional(_clip_middle),
        metadata={
            "help": "'file.yaml:LINE:COL', the command-line flag, or None without a source (cut to MAX_PATH)."
        },
    )
    parts: tuple[PathPart, ...] = attrs.field(
        default=attrs.Factory(lambda self: split_path(self.path), takes_self=True),
        converter=_as_parts,
        eq=False,
        repr=False,
        kw_only=True,
        metadata={
            "help": "The path as a tuple (('parallelism', 'pp_layer_split', 2)), uncut: what the converter "
            "found, or the dotted path read back when the issue was made from a string."
        },
    )

    def __str__(self) -> str:
        """``LOCATION: PATH: MESSAGE``; the path is left out when it is empty or the location already
        names it (an override's flag)."""
        parts = [self.location] if self.location else []
        if self.path and self.location not in (
            override_origin(self.path, True),
            override_origin(self.path, False),
        ):
            parts.append(self.path)
        return ": ".join([*parts, self.message])


def _position(issue: Issue) -> tuple[int, str, int, int, str]:
    """Sort key: file positions first (by file, line, column), then flags, then issues with no source."""
    loc = issue.location
    if loc is None:
        return (2, "", 0, 0, issue.path)
    file, _, rest = loc.rpartition(":")
    file2, _, line = file.rpartition(":")
    if line.isdigit() and rest.isdigit():
        return (0, file2, int(line), int(rest), issue.path)
    return (1, loc, 0, 0, issue.path)


class ConfigError(ValueError):
    """Every problem found in a config, raised once.

    ``issues`` is sorted by source position; ``str(error)`` puts each on its own line as
    ``FILE:LINE:COL: PATH: MESSAGE``.
    """

    issues: tuple[Issue, ...]
    #: The warnings found in the same run (a config that fails is not refused for them; they are said too).
    warnings: tuple[Issue, ...]
    #: The config of every group that could be made (those refused only by their own checks included) and
    #: the root's defaults for the ``unmade`` others, or None: the rules that span groups run on it, so
    #: that what they find in the groups that were made is in the same report as the groups' problems.
    config: Any
    #: The root groups ``config`` holds defaults for: what the rules say of them is not reported.
    unmade: frozenset[str]
    #: ``(checks, why)`` for each kind of check these errors made meaningless, so left out of the report:
    #: ``("the files the config names", "no config could be made")`` (the launch says so in one line).
    skipped: tuple[tuple[str, str], ...]
    #: Where the value at a path came from (the resolver's locator: ``FILE:LINE:COL`` or the flag), so
    #: that what later checks find in ``config`` is located as these issues are; None without a source.
    locate: Callable[..., str | None] | None

    def __init__(
        self,
        issues: Iterable[Issue],
        *,
        warnings: Iterable[Issue] = (),
        config: Any = None,
        unmade: frozenset[str] = frozenset(),
        skipped: Iterable[tuple[str, str]] = (),
        locate: Callable[..., str | None] | None = None,
    ) -> None:
        self.issues = tuple(sorted(issues, key=_position))
        if not self.issues:
            raise ValueError("ConfigError needs at least one issue")
        self.warnings = tuple(sorted(warnings, key=_position))
        self.config, self.unmade, self.skipped, self.locate = config, unmade, tuple(skipped), locate
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(str(issue) for issue in self.issues)

    def __reduce__(self) -> tuple[type["ConfigError"], tuple[tuple[Issue, ...]]]:
        return (type(self), (self.issues,))


_E = TypeVar("_E", bound="InputFileError")


class InputFileError(ConfigError):
    """A file the config names is wrong, found once the run reads it: data, tokenizer, weights, a
    checkpoint, the disk it is written to.

    Raised where the file is read, so the message can name it (``FILE: problem``, ``FILE:LINE: problem``);
    caught once by the launch command line, printed like the config errors and exit status 2, never a
    traceback. It is a :class:`ConfigError` (the same printing, the same pickling through a process
    group's collectives); :meth:`at` makes the usual one-issue error.
    """

    @classmethod
    def at(cls: type[_E], where: object, message: str, path: str = "") -> _E:
        """One problem of the file (or ``FILE:LINE``) ``where``; ``path`` is the config field that named it,
        when the message reads better with it (``FILE: checkpoint.folder: problem``)."""
        return cls([Issue(path, message, str(where))])


class TextTooLong(ValueError):
    """A text of a batch too long for one encoding under its tokenizer's growth (the tokenizer's
    ``text_problem``); ``index`` says which, so that the caller names its record without measuring the
    text again."""

    def __init__(self, index: int, problem: str) -> None:
        super().__init__(problem)
        self.index = index

    def __reduce__(self) -> tuple[type["TextTooLong"], tuple[int, str]]:
        return (type(self), (self.index, str(self)))


class ConfigWarning(UserWarning):
    """A setting that makes a run pointless but not wrong (a warmup longer than the run, validation that
    never runs): ``issue`` says where, like a :class:`ConfigError`'s issues.

    ``load_config`` emits one per finding through :mod:`warnings` (so ``-W error::...ConfigWarning`` or
    ``warnings.catch_warnings`` apply); ``strict=True`` reports them in the :class:`ConfigError` instead.
    """

    issue: Issue

    def __init__(self, issue: Issue) -> None:
        self.issue = issue
        super().__init__(str(issue))

    def __reduce__(self) -> tuple[type["ConfigWarning"], tuple[Issue]]:
        return (type(self), (self.issue,))
