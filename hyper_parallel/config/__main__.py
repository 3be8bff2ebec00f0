"""Tools for config authors: ``python -m hyper_parallel.config check FILE...`` and ``... schema``.

``check`` is for the CI of config repositories: it resolves each file and prints every issue of every
file (exit 1 if any). ``schema`` prints the JSON Schema that editors use to validate and complete YAML.
Options are never read as file names; a bad option or ``--allow-target`` prefix exits 2 before any file
is read.
"""

import json
import sys
from collections.abc import Sequence

from hyper_parallel._numbers import read_world_size
from hyper_parallel.config import ConfigError
from hyper_parallel.config.manager import config_schema, load_config_report
from hyper_parallel.config.targets import allowed_prefixes
from hyper_parallel.errors import warning_line

__all__ = ["main"]

_USAGE = """\
usage: python -m hyper_parallel.config check [--allow-target PREFIX]... [--world-size N] [--strict] FILE...
       python -m hyper_parallel.config schema [--allow-target PREFIX]...

  check FILE...  resolve each file ('-' reads standard input); print every issue as
                 FILE:LINE:COL: PATH: MESSAGE; exit 1 if any (warnings print as
                 FILE:LINE:COL: warning: PATH: MESSAGE and pass)
  schema         print the JSON Schema of TrainerConfig (every root group keyed by _target_)
  --allow-target PREFIX  also allow (check) or offer (schema) targets under this dotted module prefix
  --world-size N         check the parallel degrees against N processes
  --strict               count warnings (settings that make a run pointless) as issues
"""


def _options(
    args: Sequence[str],
    names: tuple[str, ...] = ("--allow-target", "--world-size"),
    switches: tuple[str, ...] = ("--strict",),
) -> tuple[list[str], list[str], int | None, bool] | str:
    """``(files, allowed prefixes, world size, strict)`` from a command's arguments, or what is wrong with
    them.

    An argument starting with ``-`` (other than ``-`` itself) is an option, never a file name; ``--`` ends
    the options. ``names`` are the options the command takes with a value, ``switches`` those without.
    """
    files: list[str] = []
    allowed: list[str] = []
    world_size: int | None = None
    strict = False
    it = iter(args)
    for arg in it:
        name, eq, inline = arg.partition("=")
        if arg in switches:
            strict = True
        elif name in names:
            value = inline if eq else next(it, None)
            if value is None:
                return f"{name} needs a value"
            if name == "--allow-target":
                allowed.append(value)
            else:
                world_size = read_world_size(value)
                if world_size is None:
                    return f"--world-size must be a positive integer, got {value!r}"
        elif arg == "--":
            files.extend(it)
        elif arg.startswith("-") and arg != "-":
            return f"unknown option {arg!r}"
        else:
            files.append(arg)
    try:
        allowed_prefixes(allowed)
    except ConfigError as exc:
        return "; ".join(issue.message for issue in exc.issues)
    return files, allowed, world_size, strict


def _check(files: list[str], allowed: list[str], world_size: int | None, strict: bool) -> int:
    failed = 0
    for path in files:
        stdin = path == "-"
        try:
            report = load_config_report(
                "<stdin>" if stdin else path,
                text=sys.stdin.read() if stdin else None,
                allowed_targets=allowed,
                world_size=world_size,
                strict=strict,
            )
        except ConfigError as exc:
            failed += 1
            sys.stdout.write(f"{exc}\n")
        else:
            from hyper_parallel.preflight import preflight_report

            name = "<stdin>" if stdin else path
            warnings = "".join(warning_line(issue) + "\n" for issue in report.warnings)
            sys.stdout.write(f"{warnings}{name}: ok\n" + preflight_report(report.config, world_size))
    if failed:
        sys.stdout.write(f"{failed} of {len(files)} file{'s' if len(files) != 1 else ''} failed\n")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``check`` or ``schema``; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(_USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in ("check", "schema"):
        sys.stderr.write(_USAGE)
        return 2
    check = command == "check"
    found = _options(rest) if check else _options(rest, ("--allow-target",), ())
    if isinstance(found, tuple) and bool(found[0]) != check:  # check needs a FILE, schema takes none
        found = f"schema takes no FILE, got {found[0][0]!r}" if found[0] else "no FILE given"
    if isinstance(found, str):
        sys.stderr.write(f"error: {found}\n{_USAGE}")
        return 2
    if check:
        return _check(*found)
    sys.stdout.write(json.dumps(config_schema(found[1]), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from hyper_parallel._cli import run

    run(main)
