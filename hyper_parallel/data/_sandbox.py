"""The Jinja sandbox chat templates render in, bounded in memory and work as well as in reach.

Jinja's ``ImmutableSandboxedEnvironment`` keeps a template from Python objects and files, not from work:
``'x' * 10**11``, nested ``range`` loops, a macro calling itself, or many values of medium size (a loop
joining, replacing, centring, formatting, concatenating with ``~``, slicing) whose sum is huge. The last
kind passed the length caps one value at a time and ended in an abort at about 6.7 GB. So every value a
template builds is counted, in two ways:

- before it is built, from its operands, its size (characters of a string, items of a list) must stay
  within ``MAX_RENDER_CHARS``: ``*``, ``+``, ``%`` and ``~`` on strings and lists, ``**`` and ``*`` on
  integers (``MAX_RENDER_INT_BITS``), the filters that lengthen text (``center``, ``indent``, ``format``,
  ``join``, ``replace``, ``wordwrap``, ``batch``, ``slice``, ``sum``, ``tojson``, ``escape``, ``urlencode``
  and the like, by their widths or their worst factor), the same string methods (``ljust``, ``center``,
  ``zfill``, ``expandtabs``, ``replace``, ``join``, ``format``, ``split``), a ``{{ value }}`` written out
  (a list's text counted item by item), a ``{% set %}`` block or macro's output;
- once built, its bytes (``sys.getsizeof``: the string, or a list's pointers, and the parts ``split`` and
  ``list`` make) are added to what the rendering has built, at most ``MAX_RENDER_BYTES`` for one
  conversation, however many of them were dropped on the way (the sandbox cannot see a value die).

Comparisons (``==``, ``<``, ``in``, the tests and the sorting filters) of lists, tuples and dicts whose text
passes ``MAX_RENDER_CHARS`` are refused: Python compares them in C, item by item, where the time limit (a
signal, seen between bytecodes) cannot interrupt it.

``range`` is jinja's ``safe_range`` (at most ``MAX_RANGE`` steps each) with every step counted against
``MAX_RENDER_STEPS``, and a range it refuses is this module's error, not jinja's ``OverflowError``.
``lipsum`` is not offered (its size is an argument and no chat template writes placeholder text).

Every refusal is a ``TemplateRefusal`` (a ``ValueError``) whose message starts ``the chat_template``.
"""

from __future__ import annotations

import functools
import operator
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "MAX_RENDER_BYTES",
    "MAX_RENDER_CHARS",
    "MAX_RENDER_INT_BITS",
    "MAX_RENDER_STEPS",
    "Budget",
    "TemplateRefusal",
    "bounded_environment",
    "compare_values",
    "join_values",
    "rewrite_tree",
    "slice_value",
]

#: Most characters (or list items) of one value a rendering builds, its output included: ``'x' * 10**11``
#: is refused before it is built.
MAX_RENDER_CHARS = 16 << 20
#: Most bytes of values one conversation's rendering builds, all counted (about 16 times the largest value).
MAX_RENDER_BYTES = 256 << 20
#: Most bits of an integer a template computes with ``*`` or ``**`` (a 2,500-digit number: far past a count).
MAX_RENDER_INT_BITS = 8192
#: Most iterations of ``range`` loops in one rendering (nested loops over ``range(100000)``).
MAX_RENDER_STEPS = 1_000_000

#: The filters whose text is at most this many times their value's text (escapes, case mappings).
_FACTORS = {
    "string": 1,
    "trim": 1,
    "striptags": 1,
    "upper": 3,
    "lower": 3,
    "title": 3,
    "capitalize": 3,
    "escape": 5,
    "e": 5,
    "forceescape": 5,
    "tojson": 6,
    "xmlattr": 6,
    "pprint": 12,
    "urlencode": 12,
    "urlize": 12,
}
#: The string methods whose result is at most this many times the string (case mappings, UTF-8 bytes).
_METHOD_FACTORS = {
    "upper": 3,
    "lower": 3,
    "title": 3,
    "capitalize": 3,
    "swapcase": 3,
    "casefold": 3,
    "encode": 4,
}
#: The string methods that cut a string into new ones (their parts are counted with the list).
_CUTTING = frozenset({"split", "rsplit", "splitlines", "partition", "rpartition"})
#: The filters that make a list of their value's items (a string's characters, each a new string).
_ITEMIZING = frozenset({"list", "sort", "unique", "batch", "slice", "map", "select", "reject", "groupby"})
#: The filters that compare their value's items with each other.
_COMPARING = frozenset({"sort", "unique", "min", "max", "dictsort", "groupby"})
#: Bytes a string of one character and its list slot may take (a character past Latin-1 is a new object).
_PART_BYTES = 88


class TemplateRefusal(ValueError):
    """A template that asked for more than a bound; the message starts ``the chat_template``."""


class Budget:
    """What one rendering has spent: ``range`` steps and bytes built; ``reset`` before each conversation."""

    def __init__(self) -> None:
        self.steps = 0
        self.built = 0

    def reset(self) -> None:
        self.steps = 0
        self.built = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_RENDER_STEPS:
            raise TemplateRefusal(
                f"the chat_template ran more than {MAX_RENDER_STEPS} loop steps for one conversation"
            )

    def expect(self, size: int, what: str = "a value") -> None:
        """Refuse to build ``what`` of ``size`` characters or items when it passes ``MAX_RENDER_CHARS``."""
        if size > MAX_RENDER_CHARS:
            shown = f"{size}" if size < 10**18 else "more than 10^18"
            raise TemplateRefusal(
                f"the chat_template builds {what} of {shown} items (at most {MAX_RENDER_CHARS})"
            )

    def afford(self, size: int, what: str) -> None:
        """Refuse to build ``what`` of about ``size`` bytes when it would pass ``MAX_RENDER_BYTES``."""
        if self.built + size > MAX_RENDER_BYTES:
            raise TemplateRefusal(
                f"the chat_template would build more than {MAX_RENDER_BYTES} bytes of values for one "
                f"conversation ({what})"
            )

    def charge(self, value: Any, parts: bool = False) -> Any:
        """Count ``value``'s bytes (and its string items' when ``parts``) as built; refuse past the budget."""
        if isinstance(value, (str, bytes, list, tuple, dict)):
            self.built += sys.getsizeof(value)
            if parts and isinstance(value, (list, tuple)):
                self.built += sum(sys.getsizeof(item) for item in value if isinstance(item, str))
            if self.built > MAX_RENDER_BYTES:
                raise TemplateRefusal(
                    f"the chat_template built more than {MAX_RENDER_BYTES} bytes of values for one "
                    "conversation"
                )
        return value


def _text_size(value: Any, limit: int = MAX_RENDER_CHARS, quoting: int = 10) -> int:
    """At least as many characters as ``str(value)`` has (a string's ``repr`` inside a list counted
    ``quoting`` times its length, for its escapes; 1 to count what a comparison reads). The count stops
    once past ``limit``, so a list shared a million times over costs at most ``limit / 2`` steps. A
    namespace (whose text is all it holds, out of reach) counts as past the limit."""
    import jinja2
    import jinja2.utils

    total = 0
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack and total <= limit:
        item, quoted = stack.pop()
        if isinstance(item, str):
            total += quoting * len(item) + 2 if quoted else len(item)
        elif isinstance(item, jinja2.Undefined):
            pass
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 2
        elif isinstance(item, float):
            total += 32
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(item)
            stack.extend((member, True) for member in item)
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            stack.extend((member, True) for pair in item.items() for member in pair)
        elif isinstance(item, jinja2.utils.Namespace):
            return limit + 1
        else:
            total += 200
    return total


def _int_bits(value: Any) -> int:
    return value.bit_length() if isinstance(value, int) else 0


def _format_size(template: str, args: Any, kwargs: dict[str, Any], positional: bool = False) -> int:
    """At least the characters of ``template % args`` (``positional``) or ``template.format(...)``: the
    text, every number the template holds (its widths and precisions) for each field, and the arguments:
    each once when ``%`` takes them in turn, else the widest once per field (a field may repeat one)."""
    values = list(args) if isinstance(args, (list, tuple)) else [args]
    values.extend(kwargs.values())
    if isinstance(args, dict):
        values.extend(args.values())
    sizes = [_text_size(v) for v in values]
    widths = sum(int(digits) for digits in re.findall(r"\d{1,30}", template))
    fields = template.count("%") + template.count("{")
    written = sum(sizes) if positional and not isinstance(args, dict) else fields * max(sizes, default=0)
    return len(template) + fields * widths + written


def _checked_binop(budget: Budget, operator: str, left: Any, right: Any) -> None:
    """Refuse an operation whose result would pass the bounds before it is computed."""
    if operator == "*":
        ints = isinstance(left, int) and isinstance(right, int)
        if ints and _int_bits(left) + _int_bits(right) > MAX_RENDER_INT_BITS:
            raise TemplateRefusal(
                f"the chat_template computes a product of more than {MAX_RENDER_INT_BITS} bits"
            )
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(times, int):
                size = len(seq) * times
                if size > MAX_RENDER_CHARS:
                    raise TemplateRefusal(
                        f"the chat_template builds a value of {size} items (at most {MAX_RENDER_CHARS})"
                    )
    elif operator == "+":
        sequences = isinstance(left, (str, bytes, list, tuple)) and isinstance(
            right, (str, bytes, list, tuple)
        )
        if sequences and len(left) + len(right) > MAX_RENDER_CHARS:
            raise TemplateRefusal(f"the chat_template builds a value of more than {MAX_RENDER_CHARS} items")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        if right > 64 or _int_bits(left) * right > MAX_RENDER_INT_BITS:
            shown = (
                f"{left} ** {right}"
                if _int_bits(left) <= 64
                else f"a number of {_int_bits(left)} bits ** {right}"
            )
            raise TemplateRefusal(f"the chat_template computes {shown}, a number too large to need")
    elif operator == "%" and isinstance(left, str):
        budget.expect(_format_size(left, right, {}, positional=True), "a formatted string")


def _checked_filter(
    budget: Budget, name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Refuse a filter call whose result would pass ``MAX_RENDER_CHARS``, from its arguments."""

    def arg(index: int, key: str, default: Any) -> Any:
        return args[index] if len(args) > index else kwargs.get(key, default)

    if name in _COMPARING:
        _comparable(value)
    if name in _ITEMIZING and isinstance(value, str):
        budget.afford(len(value) * _PART_BYTES, f"the characters the {name} filter makes of a text")
    if name in _FACTORS:
        budget.expect(
            _FACTORS[name] * _text_size(value, MAX_RENDER_CHARS // _FACTORS[name]), f"the {name} text"
        )
    elif name == "center":
        width = arg(0, "width", 80)
        budget.expect(max(_text_size(value), width if isinstance(width, int) else 0), "a centred text")
    elif name == "indent":
        width = arg(0, "width", 4)
        pad = width if isinstance(width, int) else len(str(width)) if isinstance(width, str) else 0
        text = _text_size(value)
        lines = str(value).count("\n") + 1 if text <= MAX_RENDER_CHARS else 1
        budget.expect(text + lines * max(pad, 0), "an indented text")
    elif name == "format":
        budget.expect(
            _format_size(value, args, kwargs, positional=not kwargs) if isinstance(value, str) else 0,
            "a formatted string",
        )
    elif name == "replace" and isinstance(value, str):
        old, new, count = arg(0, "old", ""), arg(1, "new", ""), arg(2, "count", None)
        if isinstance(old, str) and isinstance(new, str) and len(new) > len(old):
            times = (len(value) + 1 if not old else value.count(old)) if not isinstance(count, int) else count
            budget.expect(len(value) + max(times, 0) * (len(new) - len(old)), "a replaced text")
    elif name == "wordwrap":
        wrapstring = arg(3, "wrapstring", None)
        budget.expect(
            _text_size(value) * (2 + len(wrapstring if isinstance(wrapstring, str) else "\n")),
            "a wrapped text",
        )
    elif name in ("batch", "slice"):
        count = arg(0, "linecount" if name == "batch" else "slices", 0)
        size = len(value) if isinstance(value, (str, list, tuple, dict)) else 0
        budget.expect(size + (count if isinstance(count, int) else 0), f"the {name} lists")
    elif name == "sum":
        start = arg(1, "start", 0)
        if isinstance(start, (str, list, tuple)) and isinstance(value, (list, tuple)):
            total = len(start) + sum(len(v) for v in value if isinstance(v, (str, list, tuple)))
            budget.expect(total, "a sum")
            budget.expect(total * len(value) // 64, "the partial sums of a sum")


def _checked_method(
    budget: Budget, owner: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Refuse a string method call whose result would pass ``MAX_RENDER_CHARS``, from its arguments."""
    ints = [a for a in (*args, *kwargs.values()) if isinstance(a, int)]
    if name in ("center", "ljust", "rjust", "zfill"):
        budget.expect(max([len(owner), *ints]), "a padded text")
    elif name == "expandtabs":
        size = max(ints, default=8)
        budget.expect(len(owner) + owner.count("\t") * max(size, 0), "an expanded text")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        old, new = args[0], args[1]
        if len(new) > len(old):
            times = len(owner) + 1 if not old else owner.count(old)
            budget.expect(len(owner) + times * (len(new) - len(old)), "a replaced text")
    elif name in ("format", "format_map"):
        budget.expect(_format_size(owner, args, kwargs), "a formatted string")
    elif name in _CUTTING:
        separator = args[0] if args and isinstance(args[0], str) and args[0] else None
        parts = owner.count(separator) + 1 if separator is not None else len(owner) // 2 + 2
        budget.afford(parts * _PART_BYTES + 4 * len(owner), f"the parts of {name}")
    elif name in _METHOD_FACTORS:
        budget.expect(_METHOD_FACTORS[name] * len(owner), "a converted text")


def _join_size(separator: str, items: list[Any]) -> int:
    total = len(separator) * max(len(items) - 1, 0)
    for item in items:
        total += _text_size(item, MAX_RENDER_CHARS - total)
        if total > MAX_RENDER_CHARS:
            break
    return total


def bounded_environment(budget: Budget, extensions: list[Any]) -> Any:
    """A sandboxed Jinja environment (trim_blocks, lstrip_blocks) that counts what templates build
    against ``budget``; ``extensions`` are added (and ``loopcontrols``). A parsed tree must go through
    ``rewrite_tree`` before it is compiled (``~`` and slices, which the sandbox does not see)."""
    import jinja2
    import jinja2.ext
    import jinja2.runtime
    import jinja2.sandbox

    class _Bounded(jinja2.sandbox.ImmutableSandboxedEnvironment):
        """The sandbox with every growing operation checked first and counted after."""

        intercepted_binops = frozenset({"*", "+", "**", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _checked_binop(budget, operator, left, right)
            return budget.charge(super().call_binop(context, operator, left, right))

        def getitem(self, obj: Any, argument: Any) -> Any:
            value = super().getitem(obj, argument)
            return budget.charge(value) if isinstance(argument, slice) else value

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            target = getattr(__obj, "__wrapped__", __obj)
            owner = getattr(target, "__self__", None)
            name = getattr(target, "__name__", "")
            if isinstance(owner, str) and name == "join":
                items = list(args[0]) if args else []
                budget.expect(_join_size(owner, items), "a joined text")
                args = (items, *args[1:])
            elif isinstance(owner, str):
                _checked_method(budget, owner, name, args, kwargs)
            result = super().call(__context, __obj, *args, **kwargs)
            if isinstance(__obj, jinja2.runtime.Macro):
                return result  # its output was counted when its chunks were joined (``concat``)
            return budget.charge(result, parts=isinstance(owner, str) and name in _CUTTING)

    def concat(chunks: Any) -> str:
        """A ``{% set %}`` block's or a macro's output: its chunks' size checked before they are joined."""
        chunks = list(chunks)
        budget.expect(sum(len(chunk) for chunk in chunks), "a block's output")
        return str(budget.charge("".join(chunks)))

    def finalize(value: Any) -> Any:
        """A ``{{ value }}``: the text it writes is checked before ``str`` builds it."""
        budget.expect(_text_size(value), "the text of a value")
        return value

    def _range(*args: int) -> Iterator[int]:
        steps = range(*args)
        try:
            count = len(steps)
        except OverflowError:
            count = jinja2.sandbox.MAX_RANGE + 1
        if count > jinja2.sandbox.MAX_RANGE:
            raise TemplateRefusal(
                f"the chat_template asks for a range of more than {jinja2.sandbox.MAX_RANGE} steps"
            )
        for value in steps:
            budget.step()
            yield value

    environment = _Bounded(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[*extensions, jinja2.ext.loopcontrols],
        finalize=finalize,
    )
    environment.concat = concat  # type: ignore[method-assign]
    environment.globals["range"] = _range
    del environment.globals["lipsum"]
    environment.filters = {
        name: _bounded_filter(budget, name, function) for name, function in environment.filters.items()
    }
    tests: dict[str, Any] = environment.tests
    environment.tests = {name: _bounded_test(function) for name, function in tests.items()}
    return environment


def _bounded_filter(budget: Budget, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (a filter) with its result checked before (``_checked_filter``) and counted after."""
    passes = 1 if hasattr(function, "jinja_pass_arg") else 0  # a context or environment comes first

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        head, value, rest = args[:passes], args[passes] if len(args) > passes else None, args[passes + 1 :]
        if name == "join" and value is not None:
            value = list(value)
            separator = rest[0] if rest else kwargs.get("d", "")
            budget.expect(_join_size(separator if isinstance(separator, str) else "", value), "a joined text")
            args = (*head, value, *rest)
        else:
            _checked_filter(budget, name, value, rest, kwargs)
        return budget.charge(function(*args, **kwargs), parts=name == "list")

    return bounded


def _bounded_test(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (a test: ``in``, ``eq``, ``lt``, ...) with its containers checked by ``_comparable``."""

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _comparable(*args, *kwargs.values())
        return function(*args, **kwargs)

    return bounded


def rewrite_tree(tree: Any, method: Callable[[str, int], Any]) -> Any:
    """``tree`` with every ``a ~ b`` (a ``Concat`` node) a call of ``join_values``, every slice ``x[a:b:c]``
    (which jinja compiles to a plain subscript, past the sandbox's ``getitem``) a call of ``slice_value``,
    so that their size is checked before they are built, and every comparison a call of ``compare_values``
    (``_comparable``). ``method(name, line)`` is the
    node that names the extension's method calling the function (an ``ExtensionAttribute``)."""
    import jinja2.nodes
    import jinja2.visitor

    def call(name: str, args: list[Any], line: int) -> Any:
        return jinja2.nodes.Call(method(name, line), args, [], None, None, lineno=line)

    class _Rewrite(jinja2.visitor.NodeTransformer):
        def visit_Concat(self, node: Any) -> Any:
            self.generic_visit(node)
            return call("_join", list(node.nodes), node.lineno)

        def visit_Compare(self, node: Any) -> Any:
            self.generic_visit(node)
            args = [node.expr]
            for operand in node.ops:
                args += [jinja2.nodes.Const(operand.op, lineno=node.lineno), operand.expr]
            return call("_compare", args, node.lineno)

        def visit_Getitem(self, node: Any) -> Any:
            self.generic_visit(node)
            if not isinstance(node.arg, jinja2.nodes.Slice) or node.ctx != "load":
                return node
            bounds = [
                jinja2.nodes.Const(None, lineno=node.lineno) if part is None else part
                for part in (node.arg.start, node.arg.stop, node.arg.step)
            ]
            return call("_slice", [node.node, *bounds], node.lineno)

    return _Rewrite().visit(tree)


def join_values(budget: Budget, *values: Any) -> str:
    """``a ~ b ~ ...``: the values' text, its size checked before it is built (counted by the sandbox's
    ``call``, which runs this)."""
    budget.expect(_join_size("", list(values)), "a concatenated text")
    return "".join(str(value) for value in values)


_COMPARISONS: dict[str, Callable[[Any, Any], Any]] = {
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "lteq": operator.le,
    "gt": operator.gt,
    "gteq": operator.ge,
    "in": lambda a, b: a in b,
    "notin": lambda a, b: a not in b,
}


def _comparable(*values: Any) -> None:
    """Refuse comparing containers whose text passes ``MAX_RENDER_CHARS``: Python compares them item by item
    in C, where the time limit cannot interrupt it (two lists of 12 million equal strings of 16 MB: hours)."""
    for value in values:
        big = isinstance(value, (list, tuple, dict, set, frozenset)) and _text_size(value, quoting=1)
        if big and big > MAX_RENDER_CHARS:
            raise TemplateRefusal(
                f"the chat_template compares a value of more than {MAX_RENDER_CHARS} characters of text"
            )


def compare_values(*args: Any) -> bool:
    """``a OP b OP c ...`` (``args``: the first value, then each operator's name and value), each pair
    checked by ``_comparable`` first; chained as Python chains them (stopping at the first false)."""
    left = args[0]
    for index in range(1, len(args), 2):
        name, right = args[index], args[index + 1]
        if name in ("in", "notin"):
            _comparable(right)
        elif isinstance(left, (list, tuple, dict, set, frozenset)):
            _comparable(left, right)
        if not _COMPARISONS[name](left, right):
            return False
        left = right
    return True


def slice_value(budget: Budget, value: Any, start: Any, stop: Any, step: Any) -> Any:
    """``value[start:stop:step]``, its size checked before the copy is made (counted by ``call``)."""
    import jinja2

    cut = slice(start, stop, step)
    if isinstance(value, (str, bytes, list, tuple)):
        budget.expect(len(range(*cut.indices(len(value)))), "a slice")
        return value[cut]
    if isinstance(value, jinja2.Undefined):
        return value
    raise TypeError(f"a {type(value).__name__} cannot be sliced here")
