"""The config manager: files in, typed overrides, dumps out, each problem located in its source.

It binds the generic machinery (YAML with positions, the converter, overrides) to ``TrainerConfig``:
``load_config`` resolves a file and then its overrides, ``apply_overrides`` patches a resolved config
through one restructure, and ``dump_config`` writes YAML that resolves back to an equal config.
"""

import contextlib
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from hyper_parallel.config.errors import ConfigError, Issue, echo
from hyper_parallel.config.options import current_options, resolve_options
from hyper_parallel.config.resolver import converter
from hyper_parallel.config.validation import Locate, Problem, to_config_error
from hyper_parallel.config.yaml_load import SourceMap, load_yaml_file
from hyper_parallel.trainer.config import TrainerConfig

if TYPE_CHECKING:  # the overrides machinery is imported only when there are overrides
    from hyper_parallel.config.overrides import Override

__all__ = ["apply_overrides", "dump_config", "load_config", "load_config_text", "write_config"]


def _file_locator(sources: SourceMap) -> Locate:
    """Locate a problem in the file: an unknown key at the key, a missing field at the mapping that should
    hold it, anything else at its value (or, for a defaulted field, at the nearest mapping the file has)."""

    def locate(problem: Problem) -> str | None:
        mark = sources.key(problem.path) if problem.anchor == "key" else None
        if mark is None:
            mark = sources.nearest(problem.path[:-1] if problem.anchor == "parent" else problem.path)
        return str(mark) if mark is not None else None

    return locate


def load_config(
    path: str | os.PathLike[str],
    overrides: Mapping[str, object] | None = None,
    *,
    allowed_targets: Iterable[str] | None = None,
    world_size: int | None = None,
) -> TrainerConfig:
    """Resolve the YAML file at ``path``, then apply ``overrides`` (dotted keys) to the result.

    Every problem is reported in one :class:`ConfigError`, each issue located at ``FILE:LINE:COL`` in the
    file or at the flag that set the value. With ``world_size``, the parallel degrees must multiply to it.
    """
    raw, sources = load_yaml_file(path)
    return _resolve(raw, sources, overrides, allowed_targets, world_size)


def load_config_text(
    text: str | bytes,
    name: str = "<string>",
    overrides: Mapping[str, object] | None = None,
    *,
    allowed_targets: Iterable[str] | None = None,
    world_size: int | None = None,
) -> TrainerConfig:
    """Like :func:`load_config` for YAML text that is not in a file (standard input); ``name`` is the
    source that locations name (``<stdin>:LINE:COL``)."""
    from hyper_parallel.config.yaml_load import parse_yaml

    raw, sources = parse_yaml(text, name)
    return _resolve(raw, sources, overrides, allowed_targets, world_size)


def _resolve(
    raw: object,
    sources: SourceMap,
    overrides: Mapping[str, object] | None,
    allowed_targets: Iterable[str] | None,
    world_size: int | None,
) -> TrainerConfig:
    parsed = _parse_overrides(overrides or {})
    locate = _locator(parsed, sources)
    with resolve_options(allowed_targets=allowed_targets, locate=_file_locator(sources)):
        try:
            cfg = converter.structure(raw, TrainerConfig)
        except ConfigError as exc:
            if parsed:  # report what is wrong with the overrides too, not in a second run
                raise ConfigError([*exc.issues, *_override_issues(raw, parsed, locate)]) from None
            raise
        if parsed:
            cfg = _apply(cfg, parsed, sources, locate)
    if world_size is not None:
        problems = [
            Problem(tuple(field.split(".")), message) for field, message in cfg.world_size_issues(world_size)
        ]
        if problems:
            raise to_config_error(problems, locate)
    return cfg


def apply_overrides(
    cfg: TrainerConfig,
    overrides: Mapping[str, object],
    *,
    allowed_targets: Iterable[str] | None = None,
) -> TrainerConfig:
    """A new config with ``overrides`` applied: unstructure, patch every override, restructure once.

    Keys are dotted paths (``"optimizer.lr"``, ``"optimizer._target_"``); a string value is read by the
    type of the field it lands on, any other value is taken as typed. Every check runs again.
    """
    parsed = _parse_overrides(overrides)
    with resolve_options(allowed_targets=allowed_targets):
        return _apply(cfg, parsed, None, _locator(parsed, None))


def _parse_overrides(overrides: Mapping[str, object]) -> "list[Override]":
    if not overrides:
        return []
    from hyper_parallel.config.overrides import Override, parse_path

    parsed: list[Override] = []
    problems: list[Problem] = []
    for key, value in overrides.items():
        path = parse_path(key) if isinstance(key, str) else None
        if path is None:
            problems.append(
                Problem(
                    (),
                    f"malformed override key {echo(key)}: expected a dotted path such as 'optimizer.lr'",
                    "key",
                )
            )
            continue
        parsed.append(Override(key, path, value, f"--{key}"))
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
    return list(to_config_error(patch.problems, locate).issues) if patch.problems else []


def _apply(
    cfg: TrainerConfig, parsed: "list[Override]", sources: SourceMap | None, locate: Locate
) -> TrainerConfig:
    from hyper_parallel.config.overrides import OverridePatch

    facts = converter.root_facts(TrainerConfig)
    patch = OverridePatch(converter, facts, parsed, current_options().allowed)
    tree = patch.user_tree(cfg)  # a fresh tree of what the user set, the patch's own
    patch.patch(tree)
    problems = patch.problems
    locate = patch.locator(locate)  # also where the values of ``cfg`` were set
    # Restructure even when some overrides could not be placed, so every bad override is reported at once.
    try:
        with resolve_options(locate=locate):
            result = converter.structure(tree, TrainerConfig)
    except ConfigError as exc:
        found = [*to_config_error(problems, locate).issues, *exc.issues] if problems else exc.issues
        raise ConfigError(found) from None
    if problems:
        raise to_config_error(problems, locate)
    patch.record(result)
    return result


def dump_config(cfg: TrainerConfig) -> str:
    """YAML with ``_target_`` on every root group and every field explicit, in declaration order.

    ``resolve_root(yaml.safe_load(dump_config(cfg))) == cfg``. A value that cannot be named in a file is a
    :class:`ConfigError` now rather than a file that fails to load later.
    """
    from hyper_parallel.config.yaml_dump import dump_yaml  # writing is not on the resolve path

    return dump_yaml(converter.unstructure(cfg))


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
        raise ConfigError(
            [Issue("$", f"cannot write the config: {exc.strerror or exc}", str(path))]
        ) from None


def _file_mode(path: str) -> int:
    """The permission bits ``path`` has, or those a new file gets under the current umask."""
    import stat

    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0o022)  # reading the umask means setting it; put it straight back
        os.umask(umask)
        return 0o666 & ~umask
