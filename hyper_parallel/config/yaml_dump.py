"""Write plain config trees as YAML that reads back to the same values under YAML 1.1 *and* YAML 1.2.

A dumped config is meant to be loaded again, by this project's loader
(:func:`hyper_parallel.config.yaml_load.parse_yaml`, YAML 1.2 core schema) and by anyone's
``yaml.safe_load`` (YAML 1.1).  ``yaml.safe_dump`` alone does not guarantee that: it writes the string
``"1e-4"`` unquoted (a float under 1.2), and it has no opinion about 1.2-only forms such as ``0o17``.
Here a string is written plain only when *both* schemas read that plain text as the same string;
otherwise it is quoted.  Floats are written with a dot or an exponent both schemas accept
(``1.0e-05``, ``.inf``, ``.nan``).

Output is block style, keys in insertion order, unicode kept, no line folding, and never anchors or
aliases (a repeated object is written out each time).  Only ``dict`` (``str`` keys), ``list``, ``str``,
``int``, ``float``, ``bool`` and ``None`` are accepted, by exact type: anything else (tuples, sets,
enums, objects) raises ``TypeError`` naming the type and where it is, because a value that cannot be
read back as itself must not be written silently.  A self-containing structure or nesting deeper than
:data:`~hyper_parallel.config.yaml_load.MAX_DEPTH` raises ``ValueError`` (the loader would refuse it).
"""

import math
from typing import Any

import yaml

from hyper_parallel.config.yaml_load import _FLOAT, _MAP, _SEQ, _STR, MAX_DEPTH, _core_tag
from hyper_parallel.errors import format_path

__all__ = ["dump_yaml"]

#: Returned by the resolver for plain text the two schemas read differently: matches no node tag, so
#: the serializer marks the scalar as not plain-implicit and the emitter quotes it.
_AMBIGUOUS = "\x00ambiguous"
#: Returned for text holding ``${``: matches no tag, so the emitter writes ``!!str`` and the loader takes
#: the string verbatim instead of interpolating it (``yaml.safe_load`` reads it the same).
_VERBATIM = "\x00verbatim"
#: Characters that force double quotes: line breaks (YAML 1.1 also breaks on NEL/LS/PS), tabs and other
#: controls. Double-quoted scalars escape them, so they survive both loaders unchanged.
_DOUBLE_QUOTE = frozenset(
    [chr(c) for c in range(0x20)] + ["\x7f", "\x85", "\u2028", "\u2029", "\ufeff"]
    + [chr(c) for c in range(0x80, 0xA0)]
)  # fmt: skip
_WIDTH = 1 << 30


def _type_name(value: object) -> str:
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _float_text(value: float) -> str:
    """Float text read as the same float by YAML 1.1 (needs a dot, signed exponent) and by YAML 1.2."""
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value)
    if "e" in text:
        mantissa, exponent = text.split("e")
        if "." not in mantissa:
            mantissa += ".0"
        return f"{mantissa}e{exponent}"
    return text if "." in text else text + ".0"


class _Dumper(yaml.SafeDumper):
    """SafeDumper with representers for the plain config types only and a two-schema resolver."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hp_path: list[str | int] = []
        self.hp_active: set[int] = set()

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        # Indent list items under their key ("key:\n  - a"), which reads better than PyYAML's default.
        super().increase_indent(flow, False)

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and "${" in value:
            return _VERBATIM  # written with an explicit !!str, which the loader does not interpolate
        tag = super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]
        if kind is yaml.ScalarNode and implicit[0] and _core_tag(value) != tag:
            return _AMBIGUOUS
        return tag

    def hp_enter(self, data: object) -> None:
        if id(data) in self.hp_active:
            raise ValueError(f"cannot dump a structure that contains itself (at {format_path(self.hp_path)})")
        if len(self.hp_path) >= MAX_DEPTH:
            raise ValueError(
                f"cannot dump nesting deeper than {MAX_DEPTH} levels (at {format_path(self.hp_path)})"
            )
        self.hp_active.add(id(data))


def _represent_dict(dumper: _Dumper, data: dict[object, object]) -> yaml.MappingNode:
    dumper.hp_enter(data)
    pairs: list[tuple[yaml.Node, yaml.Node]] = []
    path = dumper.hp_path
    for key, value in data.items():
        if type(key) is not str:
            where = format_path(path)
            raise TypeError(f"cannot dump a key of type {_type_name(key)} at {where}: keys must be str")
        path.append(key)
        pairs.append((dumper.represent_data(key), dumper.represent_data(value)))
        path.pop()
    dumper.hp_active.discard(id(data))
    return yaml.MappingNode(_MAP, pairs, flow_style=False)


def _represent_list(dumper: _Dumper, data: list[object]) -> yaml.SequenceNode:
    dumper.hp_enter(data)
    items: list[yaml.Node] = []
    path = dumper.hp_path
    for index, value in enumerate(data):
        path.append(index)
        items.append(dumper.represent_data(value))
        path.pop()
    dumper.hp_active.discard(id(data))
    return yaml.SequenceNode(_SEQ, items, flow_style=False)


def _represent_str(dumper: _Dumper, data: str) -> yaml.ScalarNode:
    style = '"' if any(char in _DOUBLE_QUOTE for char in data) else None
    return dumper.represent_scalar(_STR, data, style=style)


def _represent_float(dumper: _Dumper, data: float) -> yaml.ScalarNode:
    return dumper.represent_scalar(_FLOAT, _float_text(data))


def _represent_other(dumper: _Dumper, data: object) -> yaml.Node:
    raise TypeError(
        f"cannot dump a value of type {_type_name(data)} at {format_path(dumper.hp_path)}: "
        "only dict, list, str, int, float, bool and None are supported"
    )


# Exact types only (PyYAML looks up ``type(data)`` first); subclasses fall through to the error.
_Dumper.yaml_representers = {}
_Dumper.yaml_multi_representers = {}
_Dumper.add_representer(dict, _represent_dict)
_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(float, _represent_float)
_Dumper.add_representer(int, yaml.SafeDumper.represent_int)
_Dumper.add_representer(bool, yaml.SafeDumper.represent_bool)
_Dumper.add_representer(type(None), yaml.SafeDumper.represent_none)
_Dumper.add_representer(None, _represent_other)  # type: ignore[arg-type]  # None = fallback


def dump_yaml(data: object) -> str:
    """YAML text for a tree of dict/list/str/int/float/bool/None that loads back equal.

    Both ``parse_yaml(dump_yaml(x))[0] == x`` and ``yaml.safe_load(dump_yaml(x)) == x`` hold (NaN
    aside, which is never equal to itself).  Raises ``TypeError`` for any other type and ``ValueError``
    for self-containing or too deeply nested data.
    """
    text: str = yaml.dump(
        data,
        Dumper=_Dumper,
        default_flow_style=False,
        sort_keys=False,
        allow_unicode=True,
        width=_WIDTH,
    )
    return text
