"""Load YAML config files safely, under the YAML 1.2 core schema, remembering where every value came from.

Why this module exists instead of ``yaml.safe_load``:

* PyYAML follows YAML 1.1: ``lr: 1e-4`` loads as the *string* ``"1e-4"``, ``no``/``off`` load as ``False``,
  ``2024-01-01`` loads as a date and a duplicate key silently keeps the last value.  Config files need the
  YAML 1.2 core schema and a loud error for duplicates.
* Error messages of the config layer point at ``file.yaml:LINE:COL``.  ``safe_load`` throws positions
  away; here the document is composed into PyYAML's node tree (``yaml.compose`` machinery with the libyaml
  C parser when available) and the Python values are built from the nodes by this module, recording a
  :class:`SourceMap` of key and value positions on the way.
* Hostile or broken input must end in one :class:`~hyper_parallel.errors.ConfigError` with a
  position, never in a PyYAML traceback, a constructed Python object, a hang or a memory blow-up: only the
  standard scalar/collection tags are accepted, the input size is checked before parsing
  (:data:`MAX_BYTES`), nesting is limited (:data:`MAX_DEPTH`) and the document as built, every alias
  expanded, is budgeted in nodes (:data:`MAX_NODES`) and in characters of text (:data:`MAX_CHARS`).  Both
  budgets are charged while the values are built, so a "billion laughs" document, or a few aliases of one
  long string, is refused before the memory is spent.

Plain (unquoted) scalars are resolved by the YAML 1.2 core schema, strictly:

* null: ``null``, ``Null``, ``NULL``, ``~`` and the empty scalar;
* bool: ``true``/``True``/``TRUE``/``false``/``False``/``FALSE`` only (``yes``, ``no``, ``on``, ``off`` are
  strings);
* int: ``[-+]?[0-9]+`` (decimal; leading zeros allowed, ``010`` is ten), ``0o[0-7]+``, ``0x[0-9a-fA-F]+``
  (a sign is only allowed on decimal integers, as in the spec);
* float: ``[-+]?(.[0-9]+|[0-9]+(.[0-9]*)?)([eE][-+]?[0-9]+)?`` (so ``1e-4``, ``.5`` and ``1.`` are floats),
  ``[-+]?.inf`` (any of ``inf``/``Inf``/``INF``) and ``.nan``/``.NaN``/``.NAN``;
* everything else is a string.  Decided deliberately: no digit separators (``1_000`` is a string), no
  sexagesimal numbers (``1:30`` is a string), no timestamps (``2024-01-01`` is a string), no binary
  ``0b101`` (a string).

Quoted and block (``|``, ``>``) scalars are always strings.  The explicit tags ``!!str``, ``!!int``,
``!!float``, ``!!bool``, ``!!null``, ``!!map`` and ``!!seq`` are honoured (``!!float 1`` is ``1.0``,
``!!str 1`` is ``"1"``); every other tag is an error.  Mapping keys must be strings.

The non-specific tag ``!`` is treated like a plain scalar (PyYAML does not distinguish the two).

Environment variables, and nothing else, are interpolated into scalars when the file is loaded:

* ``${env:NAME}`` is the variable's value (an error if it is not set), ``${env:NAME,default}`` the value or
  ``default`` (which runs to the closing ``}``).  Substitution is textual and happens before a plain
  scalar is read, so ``max_steps: ${env:STEPS,100}`` is the integer 100 and ``'${env:STEPS,100}'`` (quoted)
  the string ``"100"``; a value read from the environment is never interpolated again.
* Interpolation runs once per node: every alias of an anchored scalar reuses its result (and a problem in
  it is reported once, at the anchor).
* Any other ``${...}`` (``${DATA_DIR}``, ``${oc.env:X}``, ``${training.seq_len}``) is an error saying that
  interpolation is not supported, so a Hydra/OmegaConf reference is never taken as a literal path.
* ``$${`` is a literal ``${``; a scalar tagged ``!!str`` is taken verbatim (the dumper tags strings that
  contain ``${`` this way, so a dump reads back unchanged here and under ``yaml.safe_load``).
* Mapping keys are never interpolated.

Errors are located at the reference (``file:LINE:COL``; for a quoted or multi-line scalar, at its start).
A dump writes the resolved values.  Command-line override values use :func:`expand_env`.
"""

import functools
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence

import attrs
import yaml

from hyper_parallel.errors import ConfigError, Issue, echo, format_path

__all__ = [
    "MAX_BYTES",
    "MAX_CHARS",
    "MAX_DEPTH",
    "MAX_NODES",
    "Mark",
    "PartialDocument",
    "SourceMap",
    "expand_env",
    "is_plain_string",
    "load_yaml_file",
    "parse_scalar",
    "parse_yaml",
]

#: Largest accepted input, in bytes of UTF-8; checked before anything is parsed.
MAX_BYTES = 4 * 1024 * 1024
#: Deepest accepted nesting of mappings and sequences (the root collection's children are at depth 1).
MAX_DEPTH = 64
#: Most nodes (scalars, mappings, sequences, keys included) a document may expand to; an alias counts as
#: the full size of what it refers to, so a "billion laughs" document fails fast with bounded memory.
MAX_NODES = 100_000
#: Most characters of text (mapping keys and scalars, after ``${env:...}`` interpolation) a document may
#: expand to, an alias counting as the full text of what it refers to.  Equal to :data:`MAX_BYTES`: a file
#: without aliases holds no more text than its size, so only expansion can reach it.
MAX_CHARS = MAX_BYTES

Path = tuple[str | int, ...]

_TAG_PREFIX = "tag:yaml.org,2002:"
_STR = _TAG_PREFIX + "str"
_INT = _TAG_PREFIX + "int"
_FLOAT = _TAG_PREFIX + "float"
_BOOL = _TAG_PREFIX + "bool"
_NULL = _TAG_PREFIX + "null"
_MAP = _TAG_PREFIX + "map"
_SEQ = _TAG_PREFIX + "seq"
#: Internal tag for an untagged plain scalar, resolved later by the core schema.  It contains a NUL, which
#: cannot occur in a real tag because NUL is refused in the input.
_PLAIN = "\x00plain"
#: Internal tag for an untagged quoted or block scalar: a string, with ``${env:...}`` interpolated.
_QUOTED = "\x00quoted"
_ALLOWED_TAGS = "!!str, !!int, !!float, !!bool, !!null, !!map, !!seq"
#: The node classes, bound once: the composer and the builder test them for every node.
_ScalarNode = yaml.ScalarNode
_MappingNode = yaml.MappingNode

#: The words of the YAML 1.2 core schema and their values, the one table every reader of a word asks: null
#: (the empty plain scalar too), the booleans, the infinities and not-a-number.
_WORDS: dict[str, object] = {
    **dict.fromkeys(("", "~", "null", "Null", "NULL")),
    **dict.fromkeys(("true", "True", "TRUE"), True),
    **dict.fromkeys(("false", "False", "FALSE"), False),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
}
_BOOLS = {text: value for text, value in _WORDS.items() if type(value) is bool}
_NUMBER_START = frozenset("0123456789+-.")
_INT_DEC = re.compile(r"[-+]?[0-9]+")
_INT_OCT = re.compile(r"0o[0-7]+")
_INT_HEX = re.compile(r"0x[0-9a-fA-F]+")
_FLOAT_RE = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
#: Characters YAML 1.2 does not allow anywhere in a stream (everything outside c-printable), listed as they
#: are rather than as the complement of c-printable: the same set, compiled seven times faster (a start-up
#: cost of every command).
_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]")
#: What :func:`parse_scalar` reads without its general steps: text of at most ``_SHORT`` characters that
#: is one of the core schema's words (``_WORDS``; empty text is the empty string there), or a decimal
#: integer (``_INT_DEC``) or float (``_FLOAT_RE``), tried in that order as :func:`_resolve_plain` tries them.
_SHORT = 64
_DECIMAL = re.compile(f"(?P<int>{_INT_DEC.pattern})|(?P<float>{_FLOAT_RE.pattern})")
_MAX_MESSAGE = 200


@attrs.frozen
class Mark:
    """A position in a source: file name as given, 1-based line and column (in characters)."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


class SourceMap:
    """Where each key and value of a loaded document came from.

    Paths are tuples of mapping keys (``str``) and sequence indices (``int``); ``()`` is the document root.
    A value reached through an alias is located at the anchored node it copies.  Marks are created on
    lookup, so building the map costs one dict entry per node.
    """

    __slots__ = ("_keys", "_values", "file")

    def __init__(self, file: str) -> None:
        self.file = file
        self._keys: dict[Path, yaml.Mark] = {}
        self._values: dict[Path, yaml.Mark] = {}

    def _mark(self, raw: yaml.Mark | None) -> Mark | None:
        return None if raw is None else _yaml_mark(self.file, raw)

    def key(self, path: Path) -> Mark | None:
        """Position of the mapping key at ``path``; ``None`` for the root, list items and absent paths."""
        return self._mark(self._keys.get(path))

    def value(self, path: Path) -> Mark | None:
        """Position of the value node at ``path``; ``None`` when the path is not in the document."""
        return self._mark(self._values.get(path))

    def nearest(self, path: Path) -> Mark | None:
        """Position of the value at ``path`` or, if absent, of its closest ancestor that is present.

        Useful to locate a *missing* field: the error points at the mapping that should have held it.
        """
        parts = tuple(path)
        for end in range(len(parts), -1, -1):
            raw = self._values.get(parts[:end])
            if raw is not None:
                return self._mark(raw)
        return None

    def location(self, path: Path) -> str | None:
        """``str`` of :meth:`nearest`, ready to use as an ``Issue.location``."""
        mark = self.nearest(path)
        return None if mark is None else str(mark)

    def paths(self) -> Iterator[Path]:
        """Every path present in the document, in document order, root first."""
        return iter(self._values)

    def __contains__(self, path: object) -> bool:
        return path in self._values

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"SourceMap(file={self.file!r}, paths={len(self._values)})"


class _Abort(Exception):
    """Stops building: the issue found makes going on pointless (or dangerous)."""

    def __init__(self, issue: Issue) -> None:
        super().__init__(issue.message)
        self.issue = issue


_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Composer(_BaseLoader):  # type: ignore[valid-type,misc]
    """PyYAML loader used only to compose nodes; tags are left for :class:`_Builder` to resolve.

    ``resolve`` is called once per composed node (not per alias use), so it also counts nodes: a document
    with too many literal nodes stops while composing, before it occupies much memory.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.hp_count = 0

    def resolve(self, kind: type[yaml.Node], value: object, implicit: object) -> str:
        self.hp_count += 1
        if self.hp_count > MAX_NODES:
            raise _TooManyNodesError
        if kind is _ScalarNode:
            # implicit = (plain, quoted): untagged plain scalars follow the schema, the rest are strings
            # (quoted or block; unlike an explicit !!str, they are interpolated).
            return _PLAIN if implicit[0] else _QUOTED  # type: ignore[index]
        return _MAP if kind is _MappingNode else _SEQ


class _TooManyNodesError(Exception):
    pass


def _issue(path: Sequence[str | int], message: str, location: object) -> Issue:
    # A problem with the text itself (syntax, encoding, size) names no field: its location says it all.
    return Issue(path=format_path(path) if path else "", message=message, location=str(location))


def _text_mark(file: str, text: str, index: int) -> Mark:
    """Mark of character ``index`` in ``text``."""
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return Mark(file, line, column)


def _yaml_mark(file: str, raw: yaml.Mark) -> Mark:
    return Mark(file, raw.line + 1, raw.column + 1)


def _too_big(size: int, file: str) -> ConfigError:
    message = f"input is {size} bytes; the limit is {MAX_BYTES} bytes (MAX_BYTES)"
    return ConfigError([_issue((), message, Mark(file, 1, 1))])


def _decode(data: bytes, file: str) -> str:
    if len(data) > MAX_BYTES:
        raise _too_big(len(data), file)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        start = exc.start
        good = data[:start].decode("utf-8-sig")
        bad = data[start : start + 1].hex()
        message = f"input is not valid UTF-8 (byte 0x{bad} at offset {start})"
        raise ConfigError([_issue((), message, _text_mark(file, good, len(good)))]) from None


def _check_text(text: str, file: str) -> None:
    """Size and character checks done before PyYAML sees the text."""
    if len(text) * 4 > MAX_BYTES:
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > MAX_BYTES:
            raise _too_big(size, file)
    bad = _FORBIDDEN.search(text)
    if bad is not None:
        char = bad.group()
        code = f"U+{ord(char):04X}"
        what = f"NUL character ({code})" if char == "\x00" else f"character {code}"
        message = f"{what} is not allowed in YAML; remove it or escape it inside double quotes"
        raise ConfigError([_issue((), message, _text_mark(file, text, bad.start()))])


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def _tab_indent(text: str, line: int, column: int) -> bool:
    """Whether the indentation of ``line`` (0-based) up to ``column`` holds a tab."""
    lines = text.splitlines()
    if not 0 <= line < len(lines):
        return False
    indent = lines[line][: len(lines[line]) - len(lines[line].lstrip(" \t"))]
    return "\t" in indent[: column + 1]


def _yaml_error(exc: yaml.YAMLError, file: str, text: str) -> ConfigError:
    """Translate a PyYAML parse/compose error into a positioned ConfigError."""
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    raw = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    location: object = file if raw is None else _yaml_mark(file, raw)
    if problem == "but found another document":
        message = "several YAML documents in one file (a second one starts here); a config file holds one"
    elif isinstance(problem, str) and "duplicate anchor" in str(context):
        message = "duplicate anchor: this anchor name is already defined earlier in the file"
    elif isinstance(problem, str) and problem.startswith("found undefined alias"):
        message = "undefined alias: no anchor with this name is defined before it"
    elif raw is not None and _tab_indent(text, raw.line, raw.column):
        message = "a tab in the indentation: YAML indents with spaces only; replace the tab with spaces"
    elif problem is not None:
        message = f"invalid YAML: {problem}" + (f" ({context})" if context else "")
        if "exceeded maximum nesting depth" in problem:
            message += f"; the limit is {MAX_DEPTH} levels (MAX_DEPTH)"
    else:
        message = f"invalid YAML: {exc}"
        position = getattr(exc, "position", None)
        if isinstance(position, int) and 0 <= position <= len(text):
            location = _text_mark(file, text, position)
    return ConfigError([_issue((), _clip(message), location)])


def _compose(text: str, file: str) -> yaml.Node | None:
    loader = _Composer(text)
    try:
        node: yaml.Node | None = loader.get_single_node()
    except _TooManyNodesError:
        message = f"document has more than {MAX_NODES} nodes (MAX_NODES)"
        raise ConfigError([_issue((), message, Mark(file, 1, 1))]) from None
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, file, text) from None
    except RecursionError:  # only the pure-Python composer recurses per nesting level
        message = f"nesting is too deep; the limit is {MAX_DEPTH} levels (MAX_DEPTH)"
        raise ConfigError([_issue((), message, Mark(file, 1, 1))]) from None
    finally:
        loader.dispose()
    return node


def _short_tag(tag: str) -> str:
    return "!!" + tag[len(_TAG_PREFIX) :] if tag.startswith(_TAG_PREFIX) else tag


def _to_int(text: str) -> int | None:
    """Core-schema integer value of ``text``, or ``None`` when it is not one."""
    if _INT_DEC.fullmatch(text):
        return int(text, 10)
    if _INT_OCT.fullmatch(text):
        return int(text[2:], 8)
    if _INT_HEX.fullmatch(text):
        return int(text[2:], 16)
    return None


def _to_float(text: str) -> float | None:
    """Core-schema float value of ``text`` (integers included), or ``None`` when it is not one."""
    word = _WORDS.get(text)
    if type(word) is float:
        return word
    if _FLOAT_RE.fullmatch(text):
        return float(text)
    number = _to_int(text)
    return None if number is None else float(number)


def _resolve_plain(text: str) -> object:
    """Value of an untagged plain scalar under the YAML 1.2 core schema.

    Raises ``ValueError`` for an integer too long for Python to convert (over ~4300 digits).
    """
    if text in _WORDS:
        return _WORDS[text]
    if text[0] not in _NUMBER_START:
        return text
    number = _to_int(text)
    if number is not None:
        return number
    return float(text) if _FLOAT_RE.fullmatch(text) else text


def is_plain_string(text: str) -> bool:
    """Whether ``text`` written unquoted reads back as that same string under the YAML 1.2 core schema."""
    return _core_tag(text) == _STR


def _core_tag(text: str) -> str:
    """Tag the YAML 1.2 core schema gives the plain scalar ``text`` (used by the dumper to decide quoting)."""
    try:
        value = _resolve_plain(text)
    except ValueError:  # an integer too long to convert is an integer all the same
        return _INT
    return _CORE_TAGS[type(value)]


_CORE_TAGS = {type(None): _NULL, bool: _BOOL, int: _INT, float: _FLOAT, str: _STR}


#: How the text of a scalar tagged ``!!int``, ``!!float`` or ``!!bool`` is read (None: it is not one), and
#: what it is not when it is not.
_TAGGED: dict[str, tuple[Callable[[str], object], str]] = {
    _INT: (_to_int, "an integer (tagged !!int)"),
    _FLOAT: (_to_float, "a float (tagged !!float)"),
    _BOOL: (_BOOLS.get, "a boolean (tagged !!bool; use true or false)"),
}


class PartialDocument(ConfigError):
    """Problems that still leave a document to check (a duplicate key keeps its first value, a merge key is
    left out): ``value`` and ``sources`` are that document, so a caller can report what else is wrong with
    it in the same run. Callers that only catch :class:`ConfigError` see these problems as usual."""

    def __init__(
        self,
        issues: Iterable[Issue],
        value: object = None,
        sources: "SourceMap | None" = None,
        unread: frozenset[Path] = frozenset(),
    ):
        super().__init__(issues)
        self.value = value
        self.sources = sources
        #: The paths whose value could not be read (an unset ``${env:X}``): null in ``value``, so the rest of
        #: the document is checked; what a check says of that null is not news (an unknown key still is).
        self.unread = unread


class _Builder:
    """Builds Python values from a composed node tree, filling a SourceMap and collecting issues."""

    __slots__ = (
        "active",
        "chars",
        "count",
        "expanded",
        "file",
        "issues",
        "keys",
        "partial",
        "smap",
        "unread",
        "values",
    )

    def __init__(self, smap: SourceMap) -> None:
        self.smap = smap
        self.file = smap.file
        self.keys = smap._keys
        self.values = smap._values
        self.issues: list[Issue] = []
        #: Problems after which the document is still worth checking (see :class:`PartialDocument`).
        self.partial: list[Issue] = []
        #: Paths whose value could not be read (a bad interpolation): see :attr:`PartialDocument.unread`.
        self.unread: set[Path] = set()
        self.count = 0  # nodes built so far, against MAX_NODES (an alias adds all the nodes it copies)
        self.chars = 0  # characters of keys and scalars built so far, against MAX_CHARS (likewise)
        self.active: set[int] = set()  # ids of collection nodes being built: an alias to one is recursive
        #: id of each scalar node holding ``${`` -> its interpolated text (``None`` after a reported problem),
        #: so that its aliases reuse it.  The node tree outlives the builder, so the ids stay unique.
        self.expanded: dict[int, str | None] = {}

    def mark(self, node: yaml.Node) -> Mark:
        return _yaml_mark(self.file, node.start_mark)

    def add(self, path: Path, message: str, node: yaml.Node) -> None:
        self.issues.append(_issue(path, message, self.mark(node)))

    def abort(self, path: Path, message: str, node: yaml.Node) -> _Abort:
        return _Abort(_issue(path, message, self.mark(node)))

    def too_much_text(self, path: Path, node: yaml.Node) -> _Abort:
        """The refusal once :attr:`chars` passes :data:`MAX_CHARS` (the check is inline where text is
        counted: it runs for every key and value)."""
        message = (
            f"document expands to more than {MAX_CHARS} characters of text (MAX_CHARS); check its aliases"
        )
        return self.abort(path, message, node)

    def build(self, node: yaml.Node, path: Path) -> object:
        self.count += 1
        if self.count > MAX_NODES:
            message = f"document expands to more than {MAX_NODES} nodes (MAX_NODES); check its aliases"
            raise self.abort(path, message, node)
        self.values[path] = node.start_mark
        tag = node.tag
        if isinstance(node, _ScalarNode):
            return self.scalar(node, tag, path)
        kind, expected = ("mapping", _MAP) if isinstance(node, _MappingNode) else ("sequence", _SEQ)
        if tag != expected:
            self.add(path, self.tag_message(tag, kind), node)
            return None
        ident = id(node)
        if ident in self.active:
            message = "recursive alias: this alias refers to a collection that contains it"
            raise self.abort(path, message, node)
        if len(path) >= MAX_DEPTH:
            message = f"nesting is deeper than {MAX_DEPTH} levels (MAX_DEPTH)"
            raise self.abort(path, message, node)
        self.active.add(ident)
        try:
            if isinstance(node, _MappingNode):
                return self.mapping(node, path)
            return [self.build(item, (*path, index)) for index, item in enumerate(node.value)]
        finally:
            self.active.discard(ident)

    def tag_message(self, tag: str, kind: str) -> str:
        if tag in (_STR, _INT, _FLOAT, _BOOL, _NULL, _MAP, _SEQ):
            return f"tag {_short_tag(tag)} cannot be applied to a {kind}"
        return f"unsupported tag {echo(_short_tag(tag))}; only {_ALLOWED_TAGS} are allowed"

    def scalar(self, node: yaml.ScalarNode, tag: str, path: Path) -> object:
        text: str = node.value
        if "${" in text and tag != _STR:
            ident = id(node)
            if ident in self.expanded:  # an alias of a node already interpolated
                done = self.expanded[ident]
            else:
                done = self.expanded[ident] = self.interpolate(node, text, path)
            if done is None:  # its problems are recorded, once however many aliases it has
                self.unread.add(path)
                return None
            text = done
        self.chars += len(text)
        if self.chars > MAX_CHARS:
            raise self.too_much_text(path, node)
        if tag == _PLAIN:
            try:
                return _resolve_plain(text)
            except ValueError:
                self.add(path, f"integer with {len(text)} digits is too long", node)
                return None
        if tag in (_QUOTED, _STR):
            return text
        if tag in _TAGGED:
            read, words = _TAGGED[tag]
            try:
                value = read(text)
            except ValueError:  # an integer too long to convert
                value = None
            if value is None:
                self.add(path, f"{echo(text)} is not {words}", node)
            return value
        if tag == _NULL:
            if text not in _WORDS or _WORDS[text] is not None:
                self.add(path, f"{echo(text)} is not null (tagged !!null)", node)
            return None
        self.add(path, self.tag_message(tag, "scalar"), node)
        return None

    def interpolate(self, node: yaml.ScalarNode, text: str, path: Path) -> str | None:
        """``text`` interpolated, or ``None`` after recording its problems (located at the references)."""
        value, problems = _interpolate(text)
        if not problems:
            return value
        start, end = node.start_mark, node.end_mark
        # A one-line plain scalar is its text verbatim and ends at ``end`` (its start mark is that of an
        # anchor or tag before it): locate each reference.  Anything else is located at its start.
        first = end.column - len(text) if not node.style and start.line == end.line else None
        for offset, message in problems:  # the rest of the document is still worth checking
            column = start.column + 1 if first is None else first + offset + 1
            self.partial.append(_issue(path, message, Mark(self.file, start.line + 1, column)))
        return None

    def mapping(self, node: yaml.MappingNode, path: Path) -> dict[str, object]:
        result: dict[str, object] = {}
        keys = self.keys
        for key_node, value_node in node.value:
            self.count += 1
            key = self.key(key_node, path)
            if key is None:
                continue
            child = (*path, key)
            if key in result:  # a path is built once, so ``keys`` holds where the first one is
                message = f"duplicate key {echo(key)} (first defined at line {keys[child].line + 1})"
                self.partial.append(_issue(child, message, self.mark(key_node)))
                continue
            keys[child] = key_node.start_mark
            result[key] = self.build(value_node, child)
        return result

    def key(self, node: yaml.Node, path: Path) -> str | None:
        """The key's string, or ``None`` after recording why it is not acceptable."""
        if not isinstance(node, _ScalarNode):
            kind = "mapping" if isinstance(node, _MappingNode) else "sequence"
            self.add(path, f"a {kind} cannot be a mapping key; keys must be strings", node)
            return None
        text: str = node.value
        self.chars += len(text)
        if self.chars > MAX_CHARS:
            raise self.too_much_text(path, node)
        tag = node.tag
        if tag in (_QUOTED, _STR):
            return text
        if tag == _PLAIN:
            if text == "<<":
                message = (
                    "merge keys ('<<') are YAML 1.1 and not supported; "
                    "write the keys out or alias the whole mapping"
                )
                self.partial.append(_issue(path, message, self.mark(node)))
                return None
            try:
                value = _resolve_plain(text)
            except ValueError:
                value = None
            if isinstance(value, str):
                return text
            shown = "null" if value is None else f"{type(value).__name__} {echo(text)}"
            self.add(path, f"mapping key is {shown}; keys must be strings (quote the key)", node)
            return None
        if tag in (_INT, _FLOAT, _BOOL, _NULL):
            self.add(path, f"mapping key tagged {_short_tag(tag)}; keys must be strings", node)
            return None
        self.add(path, self.tag_message(tag, "scalar"), node)
        return None


#: The body of ``${env:NAME}`` / ``${env:NAME,default}``.
_ENV_REF = re.compile(r"env:([^,]*)(?:,(.*))?", re.DOTALL)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


#: What ``${X}``, ``${oc.env:X}`` and ``${env.X}`` probably meant: ``${env:X}``.
@functools.cache
def _meant_env() -> re.Pattern[str]:
    """What a misspelled environment reference looks like (compiled when a reference is wrong)."""
    return re.compile(r"(?:(?:oc\.)?env[:.])?([A-Za-z_][A-Za-z0-9_]*)(,.*)?", re.DOTALL | re.IGNORECASE)


_LITERAL = "$${ writes a literal '${'"


def _interpolate(text: str) -> tuple[str, list[tuple[int, str]]]:
    """``text`` with its ``${env:...}`` references replaced, and ``(offset, message)`` for each bad one."""
    out: list[str] = []
    problems: list[tuple[int, str]] = []
    done = 0
    while (start := text.find("${", done)) >= 0:
        if start > 0 and text[start - 1] == "$":  # '$${' is a literal '${'
            out.append(text[done : start - 1] + "${")
            done = start + 2
            continue
        out.append(text[done:start])
        end = text.find("}", start)
        if end < 0:
            problems.append((start, f"unterminated '${{' (no closing '}}'); {_LITERAL}"))
            return text, problems
        ref, body = text[start : end + 1], text[start + 2 : end]
        done = end + 1
        match = _ENV_REF.fullmatch(body)
        if match is None:
            meant = _meant_env().fullmatch(body)
            hint = f" (did you mean '${{env:{meant.group(1)}{meant.group(2) or ''}}}'?)" if meant else ""
            problems.append(
                (
                    start,
                    f"interpolation {echo(ref)} is not supported{hint}; only ${{env:NAME}} and "
                    f"${{env:NAME,default}} are read (from the environment); {_LITERAL}",
                )
            )
            continue
        name, default = match.groups()
        if not _ENV_NAME.fullmatch(name):
            message = f"{echo(name)} in {echo(ref)} is not an environment variable name"
            problems.append((start, message))
        elif default is not None and "${" in default:
            problems.append((start, f"nested interpolation in {echo(ref)} is not supported"))
        elif (value := os.environ.get(name, default)) is None:
            message = (
                f"environment variable {name} is not set ({echo(ref)}); "
                f"set it, or give a default: '${{env:{name},DEFAULT}}'"
            )
            problems.append((start, message))
        else:
            out.append(value)
    out.append(text[done:])
    return "".join(out), problems


def expand_env(text: str, source: str = "<command line>") -> str:
    """``text`` with ``${env:NAME}`` / ``${env:NAME,default}`` replaced by the environment, as in a file.

    For command-line values (``--dataloader.dataset.paths '[${env:DATA}/a.jsonl]'``). Any other ``${...}``,
    an unset variable without a default or an unterminated ``${`` raises
    :class:`~hyper_parallel.errors.ConfigError` located at ``source:1:COLUMN``; ``$${`` is a literal
    ``${``.
    """
    if "${" not in text:
        return text
    value, problems = _interpolate(text)
    if problems:
        raise ConfigError([_issue((), message, Mark(source, 1, offset + 1)) for offset, message in problems])
    return value


def parse_yaml(text: str | bytes, filename: str = "<string>") -> tuple[object, SourceMap]:
    """Parse one YAML document into plain Python values plus the positions of every key and value.

    ``bytes`` must be UTF-8 (a BOM is allowed).  The document may be a mapping, a sequence or a scalar;
    judging the shape is the resolver's job.  Every problem raises
    :class:`~hyper_parallel.errors.ConfigError` with ``filename:LINE:COL`` locations.
    """
    if isinstance(text, bytes):
        text = _decode(text, filename)
    _check_text(text, filename)
    node = _compose(text, filename)
    if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == _PLAIN and node.value == ""):
        message = "empty document: the input holds no YAML content (only blanks or comments)"
        raise ConfigError([_issue((), message, Mark(filename, 1, 1))])
    smap = SourceMap(filename)
    builder = _Builder(smap)
    try:
        value = builder.build(node, ())
    except _Abort as stop:
        raise ConfigError([*builder.issues, *builder.partial, stop.issue]) from None
    if builder.issues:
        raise ConfigError([*builder.issues, *builder.partial])
    if builder.partial:
        raise PartialDocument(builder.partial, value, smap, frozenset(builder.unread))
    return value, smap


def load_yaml_file(path: str | os.PathLike[str]) -> tuple[object, SourceMap]:
    """Read and parse a YAML file; ``Mark.file`` and error locations use the path as given."""
    name = os.fspath(path)
    try:
        # Opened without blocking and checked on the descriptor: a FIFO or a device would wait forever.
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb") as stream:
            mode = os.fstat(fd).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # a folder is refused below, by its read
                raise ConfigError([Issue("", "not a regular file (a FIFO, socket or device)", name)])
            data = stream.read(MAX_BYTES + 1)
    except FileNotFoundError:
        reason = "file not found"
    except IsADirectoryError:
        reason = "is a directory, not a file"
    except PermissionError:
        reason = "permission denied"
    except OSError as exc:
        reason = f"cannot read file: {exc.strerror or exc}"
    else:
        if len(data) > MAX_BYTES:
            size = os.path.getsize(name) if os.path.isfile(name) else len(data)
            raise _too_big(max(size, len(data)), name)
        return parse_yaml(data, name)
    raise ConfigError([Issue(path="", message=reason, location=name)])


def _single_line(exc: ConfigError, text: str, source: str) -> ConfigError:
    """Clamp positions past the end of a one-line value (libyaml reports its end on a virtual line 2)."""
    if "\n" in text:
        return exc
    end = str(Mark(source, 1, len(text) + 1))
    prefix = f"{source}:"
    issues = [
        attrs.evolve(issue, location=end)
        if issue.location is not None
        and issue.location.startswith(prefix)
        and not issue.location[len(prefix) :].startswith("1:")
        else issue
        for issue in exc.issues
    ]
    return ConfigError(issues)


def parse_scalar(text: str, source: str = "<command line>") -> object:
    """Read one command-line value by the same rules as a plain scalar in a file.

    ``"1e-4"`` is ``0.0001``, ``"200"`` is ``200``, ``"true"`` is ``True``, ``"null"`` is ``None`` and
    ``"yes"`` stays ``"yes"``.  Text starting with ``[`` or ``{`` is a YAML flow collection and text
    starting with a quote is a quoted YAML scalar (so ``"'1e-4'"`` is the string ``"1e-4"``).  Anything
    else is taken verbatim as a string, so ``"a: b"`` or ``"x # y"`` are not reinterpreted, and ``""`` is
    the empty string.  ``source`` names the origin in error locations.
    """
    if text and len(text) <= _SHORT:  # most values: a word of the core schema or a decimal number
        word = _WORDS.get(text, text)
        if word is not text:
            return word
        number = _DECIMAL.fullmatch(text)
        if number is not None:
            return int(text, 10) if number.lastgroup == "int" else float(text)
    _check_text(text, source)
    stripped = text.strip()
    if stripped[:1] in ("[", "{", '"', "'"):
        try:
            value, _ = parse_yaml(text, source)
        except ConfigError as exc:
            raise _single_line(exc, text, source) from None
        return value
    if not stripped:
        return text
    try:
        value = _resolve_plain(stripped)
    except ValueError:
        message = f"integer with {len(stripped)} digits is too long"
        raise ConfigError([_issue((), message, Mark(source, 1, 1))]) from None
    return text if isinstance(value, str) else value
