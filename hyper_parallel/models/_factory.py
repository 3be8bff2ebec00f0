"""The one body of every model factory: flavor lookup, typed ``overrides``, the ``ModelSpec``.

``create_model_spec(flavor=..., overrides={...})`` must fail loudly and early: an unknown flavor or
override key names the closest valid one, a value of the wrong type is refused instead of coerced, and the
architecture validators and ``cross_check`` run on the result. Override values are checked by the config
layer's own type rules (the hooks ``converter.structure`` uses, from a converter of the rules alone: models
depend on no root config), and every problem is reported at its own
key: the resolver places ``overrides.n_layers`` under the group, so a file's mistake points at its line
and a command line's at its flag.
"""

import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from hyper_parallel.models.spec import ModelArgs, ModelSpec

__all__ = [
    "CONFIG_JSON_BYTES",
    "OverrideValue",
    "create_spec",
    "flavor_writing",
    "lookup_flavor",
    "override_args",
    "overrides_check",
    "require_torch",
    "suggest",
]

#: Values ``overrides`` may carry: model arguments are scalars (nested sections via dotted keys).
OverrideValue = int | float | bool | str | None

A = TypeVar("A", bound=ModelArgs)


def suggest(name: str, candidates: typing.Iterable[str]) -> str:
    """A ``"; did you mean 'x'?"`` suffix for the closest candidate (case-insensitive), or ``""``."""
    by_lower = {c.lower(): c for c in sorted(candidates)}
    import difflib  # only a mistake pays for it

    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return f"; did you mean {by_lower[close[0]]!r}?" if close else ""


def lookup_flavor(family: str, table: Mapping[str, A], flavor: str) -> A:
    """The args of ``flavor`` in ``table``; ``ValueError`` with the valid flavors otherwise."""
    if flavor in table:
        return table[flavor]
    known = ", ".join(repr(name) for name in table)
    raise ValueError(f"unknown {family} flavor {flavor!r}{suggest(str(flavor), table)} (known: {known})")


def create_spec(
    family: str,
    table: Mapping[str, ModelArgs],
    flavor: str | None,
    weights_path: str | None,
    overrides: Mapping[str, OverrideValue] | None,
    *,
    default: str,
    build_model_fn: Callable[..., Any],
    parallelize_fn: Callable[..., Any],
    state_dict_adapter: type,
    init_fn: Callable[..., Any] | None = None,
) -> ModelSpec:
    """A ``ModelSpec`` of ``family``: ``flavor``'s arguments from ``table`` with ``overrides`` applied.

    ``flavor`` ``"auto"`` reads them from ``weights_path``'s ``config.json`` (``flavor_from_weights``): the
    table's flavor that writes the same ``config.json``, else ``"config.json"`` and the file's arguments.
    ``flavor`` None (the factories' default) is ``"auto"`` when ``weights_path`` is given, as
    ``from_pretrained`` reads a folder's ``config.json``, else the family's ``default`` flavor.

    A Hub id (``org/name[@revision]``) in the Hub cache becomes its snapshot folder (``_hub.cached``:
    never the network), into which the launch fetches the weights (``hub_id_of``). A ``weights_path``
    that is not on this machine (no folder, no cached snapshot) is kept as written: the launch's file
    checks refuse it (or fetch the Hub id), and ``auto`` cannot read it yet, so the spec's flavor stays
    ``ModelSpec.UNREAD`` with the ``default`` flavor's arguments until the launch resolves the config
    again (a config checked away from its files, ``--no-file-checks``, still resolves).
    """
    from hyper_parallel._hub import CONFIG_FILES, cached, is_hub_id

    if flavor is None:
        flavor = "auto" if weights_path is not None else default
    if weights_path is not None and is_hub_id(weights_path):  # its cached snapshot, where there is one
        weights_path = cached(weights_path, CONFIG_FILES) or weights_path
    if flavor == "auto" and weights_path is not None and not _is_folder(weights_path):
        base, flavor = lookup_flavor(family, table, default), ModelSpec.UNREAD
    elif flavor == "auto":
        base, flavor = flavor_from_weights(family, table, weights_path, state_dict_adapter)
    else:
        base = lookup_flavor(family, table, flavor)
    args = override_args(base, overrides, f"{family} {flavor}")
    return ModelSpec(
        name=family,
        flavor=flavor,
        args=args,
        weights_path=weights_path,
        build_model_fn=build_model_fn,
        parallelize_fn=parallelize_fn,
        state_dict_adapter=state_dict_adapter,
        init_fn=init_fn,
    )


def _is_folder(weights_path: str) -> bool:
    """Whether ``weights_path`` is a folder on this machine (a Hub id the cache lacks is not); asked only
    by ``flavor: auto``, so that a named flavor's factory touches no file for a local path."""
    from pathlib import Path

    from hyper_parallel._hub import is_hub_id

    return not is_hub_id(weights_path) and Path(weights_path).is_dir()


#: Most bytes a ``config.json`` may have (a real one is a few kilobytes); every reader of one bounds it so.
CONFIG_JSON_BYTES = 1 << 20


def flavor_from_weights(
    family: str, table: Mapping[str, A], weights_path: str | None, adapter: type
) -> tuple[A, str]:
    """The table's flavor whose ``config.json`` is ``weights_path``'s (its arguments and name), else the
    arguments that file describes (the adapter's ``args_from_hf_config``) named ``"config.json"``.

    Raises ``ValueError`` (one line, naming the file) without ``weights_path``, for a missing or unreadable
    file, another model's ``model_type``, or fields this model cannot express.
    """
    import json
    from pathlib import Path

    if weights_path is None:
        raise ValueError(
            f"flavor 'auto' reads the architecture from model.weights_path's config.json: set "
            f"model.weights_path, or name a flavor ({', '.join(repr(name) for name in table)})"
        )
    file = Path(weights_path) / "config.json"
    try:
        if file.stat().st_size > CONFIG_JSON_BYTES:
            raise ValueError(f"larger than {CONFIG_JSON_BYTES} bytes: not a model's config.json")
        config = json.loads(file.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{file}: does not exist (flavor 'auto' reads the architecture from it)") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{file}: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file}: not a JSON object")
    expected = adapter(next(iter(table.values()))).hf_config().get("model_type")
    if config.get("model_type") != expected:
        raise ValueError(f"{file}: model_type {config.get('model_type')!r} is not {family}'s ({expected!r})")
    try:
        args: A = adapter.args_from_hf_config(dict(config))  # type: ignore[attr-defined]
    except (KeyError, TypeError, ValueError) as exc:
        detail = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{file}: not a {family} model this project builds: {detail}") from None
    name = flavor_writing(table, adapter, args)
    return (table[name], name) if name is not None else (args, "config.json")


def flavor_writing(table: Mapping[str, A], adapter: Any, args: A) -> str | None:
    """The name of ``table``'s flavor whose exported ``config.json`` is the one ``args`` write (compared
    in that form, so a field the file leaves at its default still matches), else None."""
    written = adapter(args).hf_config()
    return next((name for name, known in table.items() if adapter(known).hf_config() == written), None)


def override_args(args: A, overrides: Mapping[str, OverrideValue] | None, what: str) -> A:
    """``args`` with ``overrides`` applied (dotted keys reach nested sections), fully checked.

    ``what`` names the flavor in messages. Raises one ``ValueError`` (the config layer's ``Problems``)
    listing every problem, each at ``overrides.<key>`` (or ``overrides`` for a check of the whole result).
    Without overrides, ``args`` (a flavor) is returned as it is: the spec's own ``cross_check`` checks it
    where it is (``args.<field>``), as it checks any result.
    """
    if not overrides:
        return args
    from hyper_parallel.config.validation import Problem, Problems, rebase

    problems: list[Problem] = []
    result: A = args
    for key, value in overrides.items():
        found = _override_one(result, str(key), value)
        if isinstance(found, Problem):
            problems.append(found)
        else:
            result = found
    if not problems:
        keys = {str(k) for k in overrides}
        for path, message in result.cross_check():
            if path in keys:
                problems.append(Problem(("overrides", path), rebase(message, ("overrides",))))
            else:
                problems.append(Problem(("overrides",), f"{path or 'args'}: {message}"))
    if problems:
        raise Problems(f"invalid model arguments for {what}", problems)
    return result


def overrides_check(table: Mapping[str, ModelArgs]) -> Callable[..., None]:
    """What a factory of ``table``'s flavors can check of its arguments without being called: each override's
    key and value against the flavor's arguments (the first flavor's when the flavor is not known). The
    resolver asks it when another argument keeps the factory from being called, so that a file's mistakes
    are all in one report; the checks of the whole result wait for the call."""

    def check_arguments(
        flavor: str | None = None, overrides: Mapping[str, OverrideValue] | None = None, **_: object
    ) -> None:
        from hyper_parallel.config.validation import Problem, Problems

        base = table.get(flavor) if flavor is not None else None
        args = base if base is not None else next(iter(table.values()))
        found = [_override_one(args, str(key), value) for key, value in (overrides or {}).items()]
        problems = [p for p in found if isinstance(p, Problem)]
        if problems:
            raise Problems("invalid model arguments", problems)

    return check_arguments


def _override_one(args: A, key: str, value: object) -> "A | Any":
    """``args`` with one override applied, or the :class:`Problem` that keeps it from applying."""
    from hyper_parallel.config.conversion import rules_converter
    from hyper_parallel.config.validation import Problem, problems_of, validator_message

    here = ("overrides", key)
    parts = key.split(".")
    owner: object = args
    for depth, part in enumerate(parts):
        cls = type(owner)
        fields = attrs.fields_dict(cls)  # type: ignore[arg-type]
        if part not in fields or not fields[part].init:
            prefix = ".".join(parts[:depth])
            names = [(f"{prefix}." if prefix else "") + name for name in fields]
            return Problem(here, f"unknown argument {key!r} of {cls.__name__}{suggest(key, names)}", "key")
        if depth < len(parts) - 1:
            owner = getattr(owner, part)
            if owner is None or not attrs.has(type(owner)):
                section = ".".join(parts[: depth + 1])
                state = "null in this flavor" if owner is None else "not a section"
                return Problem(here, f"{section} is {state}", "key")
    field = attrs.fields_dict(type(owner))[parts[-1]]  # type: ignore[arg-type]
    if attrs.has(type(getattr(owner, parts[-1]))):
        return Problem(here, f"{key!r} is a section; set its fields as '{key}.<field>'", "key")
    annotation = typing.get_type_hints(type(owner))[field.name]
    try:
        checked = rules_converter().get_structure_hook(annotation)(value, annotation)
    except Exception as exc:
        (first, *_) = problems_of(exc, here)
        return first
    try:
        return _replace(args, parts, checked)
    except (TypeError, ValueError) as exc:
        return Problem(here, validator_message(exc, field, checked))


def _replace(obj: Any, parts: list[str], value: object) -> Any:
    head, *rest = parts
    if not rest:
        return attrs.evolve(obj, **{head: value})
    return attrs.evolve(obj, **{head: _replace(getattr(obj, head), rest, value)})


def require_torch(model: str, what: str) -> None:
    """Raise a helpful ``ImportError`` when a runtime hook is called without the optional torch extra."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ImportError(
            f"{model} {what} needs PyTorch, which is not installed: "
            "pip install 'hyper_parallel[torch]' (torch==2.13.0)"
        )
