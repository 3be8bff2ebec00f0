"""What attrs' generated ``__init__`` stores, for the classes whose construction a structure hook writes out.

A warm resolve constructs some twenty Config objects from checked values. Calling ``cls(**kwargs)`` costs a
keyword dict, the matching of every keyword to a parameter, and one call per validator; for a frozen,
dict-based attrs class whose ``__init__`` attrs generated, that ``__init__`` does nothing but store each
field (its argument, else its default value, else what its default factory makes) in the instance's
``__dict__`` in field order, then run the validators. A structure hook that knows this can store the
fields itself (:func:`hyper_parallel.config.types.attrs_hook`): a third of the cost of a group.

:func:`plain_init` says which classes those are, from attrs' own description of a class
(``attrs.inspect``); any other class (a custom ``__init__``, ``__attrs_pre_init__``/``__attrs_post_init__``,
a converter, a slotted, mutable or exception class, a cached hash, a field attrs does not take as an
argument, a subclass not decorated itself) is constructed by calling it.
``tests/config/test_attrs_adapter.py`` pins that every shipped Config class is plain and that its written
construction gives what ``cls(**kwargs)`` gives.
"""

from typing import Any, Literal, NamedTuple

import attrs

__all__ = ["InitField", "plain_init"]


class InitField(NamedTuple):
    """One field as attrs' ``__init__`` stores it."""

    #: The field's name: the instance's ``__dict__`` key and the mapping's key.
    name: str
    #: What ``__init__`` stores when the field is not given: the default ``value``, what ``factory()``
    #: returns, or nothing (``required``: the call would fail).
    missing: Literal["value", "factory", "required"]
    #: The default value, or the factory; None when required.
    default: Any
    #: The field's validator (attrs calls it after every field is stored), or None.
    validator: Any
    #: attrs' description of the field, the second argument of its validator.
    attribute: Any


def plain_init(cls: type) -> list[InitField] | None:
    """``cls``'s fields in the order attrs' generated ``__init__`` stores them, or None when constructing
    ``cls`` is more than storing them (see the module doc)."""
    describe = getattr(attrs, "inspect", None)  # attrs >= 25.4; before it, every class is called
    if describe is None or "__attrs_props__" not in cls.__dict__:  # not decorated itself: called
        return None
    props = describe(cls)
    if (
        not props.added_init
        or props.is_slotted
        or not props.is_frozen
        or props.is_exception
        or props.hashability is attrs.ClassProps.Hashability.HASHABLE_CACHED
        or hasattr(cls, "__attrs_pre_init__")
        or hasattr(cls, "__attrs_post_init__")
    ):
        return None
    out = []
    for f in attrs.fields(cls):
        if not f.init or f.converter is not None:
            return None
        default = f.default
        if default is attrs.NOTHING:
            out.append(InitField(f.name, "required", None, f.validator, f))
        elif isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            if default.takes_self:
                return None
            out.append(InitField(f.name, "factory", default.factory, f.validator, f))
        else:
            out.append(InitField(f.name, "value", default, f.validator, f))
    return out
