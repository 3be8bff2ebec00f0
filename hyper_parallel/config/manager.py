"""The config manager: files in, typed overrides, dumps out, each problem located in its source.

It binds the generic machinery (YAML with positions, the converter, overrides) to ``TrainerConfig`` and
its rules (:mod:`hyper_parallel.trainer.rules`): ``load_config`` resolves a file and then its overrides,
``apply_overrides`` patches a resolved config through one restructure, and ``dump_config`` writes YAML
that resolves back to an equal config. With ``trainer="lm"`` or ``"vl"`` (what the launcher feeds), the
rules of that trainer are checked too.
"""

import contextlib
import os
import typing
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import attrs
import yaml

from hyper_parallel._checks import Quote, Said
from hyper_parallel.config.options import current_options, resolve_options
from hyper_parallel.config.resolver import converter
from hyper_parallel.config.validation import (
    Locate,
    Path,
    Problem,
    cross_check_errors,
    problems_of,
    to_config_error,
    with_ancestors,
)
from hyper_parallel.config.yaml_load import PartialDocument, SourceMap, load_yaml_file, parse_yaml
from hyper_parallel.errors import (
    ConfigError,
    ConfigWarning,
    Issue,
    echo,
    format_path,
    override_origin,
    split_path,
)
from hyper_parallel.trainer import rules
from hyper_parallel.trainer.config import TrainerConfig
from hyper_parallel.trainer.rules import TrainerKind

if TYPE_CHECKING:  # the overrides machinery is imported only when there are overrides
    from hyper_parallel.config.overrides import Override

__all__ = [
    "NO_CONFIG",
    "ConfigReport",
    "apply_overrides",
    "config_schema",
    "dump_config",
    "load_config",
    "load_config_report",
    "located_issues",
    "unmade_reason",
    "validate",
    "write_config",
]


def _file_locator(sources: SourceMap) -> Locate:
    """Locate a problem in the file: an unknown key at the key, a missing field at the mapping that should
    hold it, anything else at its value (or, for a defaulted field, at the nearest mapping the file has)."""

    def locate(problem: Problem) -> str | None:
        mark = sources.key(problem.path) if problem.anchor == "key" else None
        if mark is None:
            mark = sources.nearest(problem.path[:-1] if problem.anchor == "parent" else problem.path)
        return str(mark) if mark is not None else None

    return locate


class ConfigReport(typing.NamedTuple):
    """A resolved config with what :func:`load_config` knows beside it."""

    #: The resolved, checked config.
    config: TrainerConfig
    #: Settings that make the run pointless but not wrong (``TrainerConfig.warnings``), located like
    #: a :class:`ConfigError`'s issues; empty under ``strict=True``, which refuses them.
    warnings: tuple[Issue, ...]
    #: Every path the file or an override set (``("optimizer", "lr")``) and each of their ancestors.
    given: frozenset[Path]
    #: Where the value at a path came from (``FILE:LINE:COL``, or the flag that set it).
    locate: Locate | None = None

    def located(self, pairs: Iterable[tuple[str, str]], source: str) -> list[Issue]:
        """:func:`located_issues` with this config's locator."""
        return located_issues(pairs, self.locate, source)


def located_issues(pairs: Iterable[tuple[str, str]], locate: Locate | None, source: str) -> list[Issue]:
    """``(dotted path, message)`` findings about a resolved config (a file it names is missing) as issues
    located as the resolver locates its own (``locate``): where the value was set, in the file or by a
    flag; a finding about no one field is at ``source``."""
    pairs = list(pairs)
    found = [Issue("", message, source) for path, message in pairs if not path]
    return found + _issues([(path, message) for path, message in pairs if path], locate)


def load_config(
    path: str | os.PathLike[str],
    overrides: Mapping[str, object] | None = None,
    *,
    text: str | bytes | None = None,
    allowed_targets: Iterable[str] | None = None,
    world_size: int | None = None,
    strict: bool = False,
    trainer: TrainerKind | None = None,
) -> TrainerConfig:
    """Resolve the YAML file at ``path``, then apply ``overrides`` (dotted keys) to the result.

    Every problem is reported in one :class:`ConfigError`, each issue located at ``FILE:LINE:COL`` in the
    file or at the override that set the value. ``text`` is YAML that is not in a file (standard input):
    it is read instead, and ``path`` only names it in locations (``<stdin>:LINE:COL``). With
    ``world_size``, the parallel degrees must multiply to it. With ``trainer`` (``"lm"`` for
    ``LLMTrainer``, ``"vl"`` for ``VLTrainer``), the config must be one that trainer can train. Settings
    that make the run pointless but not wrong are emitted as :class:`ConfigWarning` through
    :mod:`warnings`; ``strict=True`` makes them errors. :func:`load_config_report` returns them instead.
    """
    report = load_config_report(
        path,
        overrides,
        text=text,
        allowed_targets=allowed_targets,
        world_size=world_size,
        strict=strict,
        trainer=trainer,
    )
    _emit(report.warnings, stacklevel=3)
    return report.config


def load_config_report(
    path: str | os.PathLike[str],
    overrides: Mapping[str, object] | None = None,
    *,
    text: str | bytes | None = None,
    allowed_targets: Iterable[str] | None = None,
    world_size: int | None = None,
    strict: bool = False,
    command_line: bool = False,
    trainer: TrainerKind | None = None,
) -> ConfigReport:
    """:func:`load_config`, returning the config with its warnings instead of emitting them.

    ``text`` is read instead of the file, ``path`` then only names it in locations. ``command_line`` says
    the overrides came from command-line flags, so issues name them ``--optimizer.lr`` (else
    ``overrides['optimizer.lr']``) and trainers by their commands (``train_vl``, else ``VLTrainer``).
    """
    early: tuple[Issue, ...] = ()
    unread: frozenset[Path] = frozenset()  # values the file could not give (an unset ${env:X})
    try:
        if text is None:
            raw, sources = load_yaml_file(path)
        else:
            raw, sources = parse_yaml(text, os.fspath(path))
    except PartialDocument as exc:  # duplicate keys and the like: reported with everything else
        if exc.sources is None:
            raise
        raw, sources, early, unread = exc.value, exc.sources, exc.issues, exc.unread
    parsed = _parse_overrides(overrides or {}, command_line)
    locate = _locator(parsed, sources)
    file_given = with_ancestors(sources.paths())
    before = (file_given, _file_locator(sources))
    found = list(early)
    cfg: TrainerConfig | None = None
    # The root's rules run below with the world size and the trainer's, so all of them report in one pass.
    with resolve_options(allowed_targets=allowed_targets, locate=_file_locator(sources), root_checks=False):
        made: TrainerConfig | None = None  # see ConfigError.config: the rules still run on it
        unmade: frozenset[str] = frozenset()
        skipped: list[tuple[str, str]] = []
        try:
            cfg = converter.structure(raw, TrainerConfig)
        except ConfigError as exc:
            # Report what is wrong with the overrides too, not in a second run.
            found += [*exc.issues, *(_override_issues(raw, parsed, locate) if parsed else ())]
            made, unmade, skipped = exc.config, exc.unmade, list(exc.skipped)
            if made is not None and parsed:  # the rules see the overrides' values too
                made, unmade = _apply_sound(made, unmade, parsed, before, locate)
        if cfg is not None and parsed:
            try:
                cfg = _apply(cfg, parsed, before, locate).config
            except ConfigError as exc:
                found += exc.issues
                made, unmade = exc.config, exc.unmade
                if made is None:  # an override that could not be placed: the rules see the others'
                    made, unmade = _apply_sound(cfg, unmade, parsed, before, locate, exc)
                cfg = None
    if unread:  # what the resolve says of a value the file could not give is not news
        found = [*early, *(i for i in found[len(early) :] if not _of_unread(i, unread, sources))]
        unmade |= {str(p[0]) for p in unread if p}
    warned: list[Issue] = []
    made = cfg if cfg is not None else made
    if made is not None:
        names = rules.COMMANDS if command_line else rules.TRAINER_CLASSES
        known = {(i.path, str(i.message)) for i in found}
        spanning = [i for i in _root_issues(made, world_size, trainer, names, locate) if _new(i, known)]
        found += [i for i in spanning if not _reads(i, unmade)]
        warned = [i for i in _issues(rules.warnings(made), locate) if not _reads(i, unmade)]
        unsaid = sorted({g for i in spanning if _reads(i, unmade) for g in _groups(i) if g in unmade})
        if unsaid:  # a rule's verdict on a group's default is no verdict on what the file gave
            skipped.append((f"the rules that span groups, on {', '.join(unsaid)}", unmade_reason(unsaid)))
    elif found:
        skipped.append(("the rules that span groups", NO_CONFIG))
    if strict:
        found, warned = [*found, *warned], []
    if found:
        raise ConfigError(
            _cite_overrides(found, parsed),
            warnings=_cite_overrides(warned, parsed),
            config=made,
            unmade=unmade,
            skipped=skipped,
            locate=locate,
        )
    assert cfg is not None
    given = file_given | with_ancestors(o.path for o in parsed)
    return ConfigReport(cfg, tuple(_cite_overrides(warned, parsed)), given, locate)


_Applied = typing.TypeVar("_Applied", TrainerConfig, ConfigReport)
#: What a report knows of the config overrides apply to: the paths the user set, and where each was set.
_Known = tuple[frozenset[Path], Locate | None] | None


def apply_overrides(
    cfg: _Applied,
    overrides: Mapping[str, object],
    *,
    allowed_targets: Iterable[str] | None = None,
    strict: bool = False,
) -> _Applied:
    """A new config with ``overrides`` applied: unstructure, patch every override, restructure once.

    Keys are dotted paths (``"optimizer.lr"``, ``"optimizer._target_"``); a string value is read by the
    type of the field it lands on, any other value is taken as typed. Every check runs again; warnings are
    emitted or, with ``strict=True``, raised as in :func:`load_config`.

    Given a :class:`ConfigReport` (:func:`load_config_report`'s, or this function's), the overrides apply
    to its config knowing what the user set and where (a ``_target_`` switch keeps exactly those values,
    and a problem is located where its value was set), and the result is the new config's report, with its
    warnings in it instead of emitted. Given a bare config, each value that differs from its default counts
    as set.
    """
    parsed = _parse_overrides(overrides, False)
    bare, before = (cfg.config, (cfg.given, cfg.locate)) if isinstance(cfg, ConfigReport) else (cfg, None)
    with resolve_options(allowed_targets=allowed_targets):
        try:
            result = _apply(bare, parsed, before, _locator(parsed, None))
        except ConfigError as exc:
            raise ConfigError(_cite_overrides(exc.issues, parsed)) from None
    warned = _cite_overrides(_issues(rules.warnings(result.config), result.locate), parsed)
    if strict and warned:
        raise ConfigError(warned)
    if isinstance(cfg, ConfigReport):
        return result._replace(warnings=tuple(warned))
    _emit(warned, stacklevel=3)
    return result.config


def validate(
    cfg: TrainerConfig,
    *,
    world_size: int | None = None,
    strict: bool = False,
    trainer: TrainerKind | None = None,
) -> tuple[Issue, ...]:
    """Check a config built in Python as the resolver checks a file: raise the :class:`ConfigError` that
    resolving the same config would raise, every issue at once; return its warnings (with ``strict=True``
    they are errors, and nothing is returned).

    Each group is checked (types, validators, the group's own checks), then, once every group is sound,
    the rules that span groups, with ``world_size`` (the parallel degrees must fit it) and ``trainer``
    (``"lm"`` for ``LLMTrainer``, ``"vl"`` for ``VLTrainer``) when given. Nothing is located: the values
    were set in Python.
    """
    from hyper_parallel.config.root import check_groups

    problems = check_groups(converter, converter.root_facts(TrainerConfig), cfg)
    if problems:
        raise to_config_error(problems, None)
    found = _root_issues(cfg, world_size, trainer, rules.TRAINER_CLASSES, None)
    warned = _issues(rules.warnings(cfg), None)
    if strict:
        found, warned = [*found, *warned], []
    if found:
        raise ConfigError(found)
    return tuple(warned)


def _root_issues(
    cfg: TrainerConfig,
    world_size: int | None,
    trainer: TrainerKind | None,
    names: Mapping[TrainerKind, str],
    locate: Locate | None,
) -> list[Issue]:
    """Every rule that spans groups, in one pass: the root's ``cross_check``, the rules of ``world_size``
    ranks (when known) and of the ``trainer`` (an issue two rules find is reported once)."""
    problems = [p for exc in cross_check_errors(cfg) for p in problems_of(exc)]
    pairs = rules.world_size_issues(cfg, world_size) if world_size is not None else []
    return _issues([*pairs, *rules.trainer_issues(cfg, trainer, names)], locate, problems)


#: Why nothing that needs a whole config was checked (:attr:`ConfigError.skipped`).
NO_CONFIG = "no config could be made while these errors stand"


def unmade_reason(groups: Iterable[str]) -> str:
    """Why what reads ``groups`` was not checked (:attr:`ConfigError.skipped`)."""
    groups = list(groups)
    return f"{', '.join(groups)} {'has' if len(groups) == 1 else 'have'} errors"


def _new(issue: Issue, known: set[tuple[str, str]]) -> bool:
    return (issue.path, str(issue.message)) not in known


def _groups(issue: Issue) -> set[str]:
    """The root groups ``issue`` is at or quotes a value of."""
    paths = (
        [issue.path, *(q.path for q in issue.message.quotes)]
        if isinstance(issue.message, Said)
        else [issue.path]
    )
    return {path.partition(".")[0].partition("[")[0] for path in paths}


def _reads(issue: Issue, groups: frozenset[str]) -> bool:
    """Whether ``issue`` is at, or quotes a value of, one of root ``groups``."""
    return not _groups(issue).isdisjoint(groups)


def _issues(
    pairs: Iterable[tuple[str, str]], locate: Locate | None, problems: Iterable[Problem] = ()
) -> list[Issue]:
    """``problems``, then root-relative ``(dotted path, message)`` pairs, as located issues (each once)."""
    found = [*problems, *(Problem(split_path(field), message) for field, message in pairs)]
    return list(to_config_error(found, locate).issues) if found else []


def _emit(found: Iterable[Issue], stacklevel: int) -> None:
    """Emit each warning as a :class:`ConfigWarning`, attributed to the frame ``stacklevel`` levels up
    (``_emit`` is 1, the public function calling it 2, that function's caller 3)."""
    found = list(found)
    if found:
        import warnings  # only a config with something to warn about pays for it

        for issue in found:
            warnings.warn(ConfigWarning(issue), stacklevel=stacklevel)


def _cite_overrides(issues: Iterable[Issue], parsed: "list[Override]") -> list[Issue]:
    """Issues whose message quotes another field's value (a :class:`~hyper_parallel._checks.Quote`:
    ``training.max_steps (10)``) that an override set say so: ``training.max_steps (10, set by
    --training.max_steps)``. The quote's path is matched with the override's, and its value with the value
    the override gave, so a message citing a value the override did not give (an inferred degree) cites
    nothing; an override of the issue's own field is already its location, and is not cited again."""
    issues = list(issues)
    if not parsed or not issues:
        return issues
    by_path = {format_path(o.path): o for o in parsed}
    out = []
    for issue in issues:
        message = issue.message
        if isinstance(message, Said):
            parts = tuple(p if isinstance(p, str) else _cited(p, by_path, issue.path) for p in message.parts)
            if parts != message.parts:
                issue = attrs.evolve(issue, message=Said(parts))
        out.append(issue)
    return out


def _cited(q: Quote, by_path: "dict[str, Override]", issue_path: str) -> Quote:
    """``q`` with the origin of the override that set the value it quotes, if one did."""
    o = by_path.get(q.path)
    if o is None or q.path == issue_path or not _same_value(q.value, o.value):
        return q
    return attrs.evolve(q, origin=o.origin)


def _same_value(value: object, given: object) -> bool:
    """Whether ``value`` (what a message quotes, from the resolved config) is what an override ``given``
    (typed, or a string read by the field's type) set."""
    if value == given or f"{value}" == f"{given}":
        return True
    if not isinstance(given, str):
        return False
    try:
        return bool(yaml.safe_load(given) == value)
    except yaml.YAMLError:
        return False


def _parse_overrides(overrides: Mapping[str, object], command_line: bool) -> "list[Override]":
    if not overrides:
        return []
    from hyper_parallel.config.overrides import Override, parse_path

    parsed: list[Override] = []
    problems: list[Problem] = []
    for key, value in overrides.items():
        path = parse_path(key) if isinstance(key, str) else None
        if path is None:
            message = f"malformed override key {echo(key)}: expected a dotted path such as 'optimizer.lr'"
            problems.append(Problem((), message, "key"))
        else:  # Override(...) without NamedTuple's Python-level __new__: one per override, every call
            parsed.append(tuple.__new__(Override, (key, path, value, override_origin(key, command_line))))
    if problems:
        raise to_config_error(problems, None)
    return parsed


def _locator(parsed: "list[Override]", sources: SourceMap | None) -> Locate:
    """Locate a problem at the override that set its value, else in the file."""
    file_locate = _file_locator(sources) if sources is not None else None

    def locate(problem: Problem) -> str | None:
        best = None
        for o in parsed:
            if problem.path[: len(o.path)] == o.path and (best is None or len(o.path) > len(best.path)):
                best = o
        if best is not None:
            return best.origin
        if problem.anchor == "key":  # an unknown name on the way to an override's field
            for o in parsed:
                if o.path[: len(problem.path)] == problem.path:
                    return o.origin
        return file_locate(problem) if file_locate is not None else None

    return locate


def _override_issues(raw: object, parsed: "list[Override]", locate: Locate) -> list[Issue]:
    from hyper_parallel.config.overrides import OverridePatch

    patch = OverridePatch(converter, converter.root_facts(TrainerConfig), parsed, current_options().allowed)
    patch.check(raw)
    return _issues((), locate, patch.problems)


def _apply(cfg: TrainerConfig, parsed: "list[Override]", before: _Known, locate: Locate) -> ConfigReport:
    """``cfg`` with the overrides applied, and what the user set in it (``before``: the paths it had set in
    ``cfg`` and where, if known) and where; the report's warnings are left to the caller."""
    from hyper_parallel.config.overrides import OverridePatch

    given, where = before if before is not None else (None, None)
    facts = converter.root_facts(TrainerConfig)
    patch = OverridePatch(converter, facts, parsed, current_options().allowed, given, where)
    tree = patch.user_tree(cfg)  # the whole config written out, the patch's own
    patch.patch(tree)
    problems = patch.problems
    locate = patch.locator(locate)  # also where the values of ``cfg`` were set
    # Restructure even when some overrides could not be placed: every bad override reported at once.
    try:
        with resolve_options(locate=locate):
            result = converter.structure(tree, TrainerConfig)
    except ConfigError as exc:
        found = [*_issues((), locate, problems), *exc.issues]
        config, unmade = (None, frozenset[str]()) if problems else (exc.config, exc.unmade)
        raise ConfigError(found, config=config, unmade=unmade) from None
    if problems:
        raise to_config_error(problems, locate)
    return ConfigReport(result, (), frozenset() if given is None else patch.given(given), locate)


def _apply_sound(
    cfg: TrainerConfig,
    unmade: frozenset[str],
    parsed: "list[Override]",
    before: _Known,
    locate: Locate,
    failed: ConfigError | None = None,
) -> tuple[TrainerConfig | None, frozenset[str]]:
    """``cfg`` with the overrides that are sound, for the rules that span groups (the problems of the others
    are reported already): an override at or under a path with a problem is left out, and the root group
    of a field it set joins ``unmade``, so no rule speaks of a value the user set otherwise (one naming no
    field set nothing). ``failed`` is what applying all of them raised, when known. ``(None, unmade)`` when
    even the sound ones cannot be applied."""
    if failed is None:
        try:
            return _apply(cfg, parsed, before, locate).config, unmade
        except ConfigError as exc:
            failed = exc
    if failed.config is not None:
        return failed.config, unmade | failed.unmade
    bad = {issue.parts for issue in failed.issues}
    sound = [o for o in parsed if not any(_overlap(o.path, p) for p in bad)]
    unmade |= {str(o.path[0]) for o in parsed if o not in sound and _names_a_field(cfg, o.path)}
    if len(sound) == len(parsed):
        return None, unmade
    try:
        return (_apply(cfg, sound, before, locate).config if sound else cfg), unmade
    except ConfigError:
        return None, unmade


def _names_a_field(cfg: object, path: Path) -> bool:
    """Whether ``path`` leads to a value of ``cfg`` (a ``_target_`` always does: it names the class)."""
    node = cfg
    for part in path:
        if part == "_target_":
            return True
        try:
            node = node[part] if isinstance(part, int) else getattr(node, part)  # type: ignore[index]
        except (AttributeError, IndexError, KeyError, TypeError):
            return False
    return True


def _of_unread(issue: Issue, unread: frozenset[Path], sources: SourceMap) -> bool:
    """Whether ``issue`` speaks of a value the file could not give (``unread``: null in the document), not
    of its key (an unknown key is located at the key, and is news)."""
    for path in unread:
        if _overlap(issue.parts, path):
            key = sources.key(path) if issue.parts == path else None
            return key is None or issue.location != str(key)
    return False


def _overlap(a: Path, b: Path) -> bool:
    """Whether one of two paths is the other or under it."""
    return a[: len(b)] == b or b[: len(a)] == a


def dump_config(cfg: TrainerConfig) -> str:
    """YAML with ``_target_`` on every root group and every field explicit, in declaration order.

    ``resolve_root(yaml.safe_load(dump_config(cfg))) == cfg``. A value that cannot be named in a file is a
    :class:`ConfigError` now rather than a file that fails to load later.
    """
    from hyper_parallel.config.yaml_dump import dump_yaml  # writing is not on the resolve path

    return dump_yaml(converter.unstructure(cfg))


def config_schema(allowed_targets: Iterable[str] = ()) -> dict[str, typing.Any]:
    """The JSON Schema of ``TrainerConfig`` documents, offering the targets of its packages and of
    ``allowed_targets`` (``python -m hyper_parallel.config schema``)."""
    from hyper_parallel.config.schema import json_schema  # only the schema command pays for it

    return json_schema(converter, TrainerConfig, allowed_targets)


def write_config(cfg: TrainerConfig, path: str | os.PathLike[str]) -> None:
    """Write :func:`dump_config` to ``path`` atomically: a reader sees the old file or the whole new one.

    The file gets the permissions any new file gets (``0o666`` less the umask), or keeps those of the file
    it replaces; the temporary file it is written through is private until then.
    """
    import tempfile  # only the writing path pays for it; a dry run never does

    text = dump_config(cfg)
    target = os.fspath(path)
    folder, name = os.path.split(target)
    try:
        mode = _file_mode(target)
        fd, tmp = tempfile.mkstemp(dir=folder or ".", prefix=f".{name}.", suffix=".tmp")
        try:
            os.chmod(tmp, mode)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise ConfigError([Issue("", f"cannot write the config: {exc.strerror or exc}", str(path))]) from None


def _file_mode(path: str) -> int:
    """The permission bits ``path`` has, or those a new file gets under the current umask."""
    import stat

    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0o022)  # reading the umask means setting it; put it straight back
        os.umask(umask)
        return 0o666 & ~umask
