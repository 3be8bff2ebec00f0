"""Tools for config authors: ``python -m hyper_parallel.config check FILE...`` and ``... schema``.

``check`` is for the CI of config repositories: it resolves each file and prints every issue of every
file (exit 1 if any). ``schema`` prints the JSON Schema that editors use to validate and complete YAML.
"""

import json
import sys
from collections.abc import Sequence

from hyper_parallel.config import ConfigError, load_config
from hyper_parallel.config.schema import json_schema
from hyper_parallel.trainer.config import TrainerConfig

__all__ = ["main"]

_USAGE = """usage: python -m hyper_parallel.config check [--allow-target PREFIX] FILE...
       python -m hyper_parallel.config schema

  check FILE...  resolve each file; print every issue as FILE:LINE:COL: PATH: MESSAGE; exit 1 if any
  schema         print the JSON Schema of TrainerConfig (every root group keyed by _target_)
"""


def _check(args: Sequence[str]) -> int:
    files: list[str] = []
    allowed: list[str] = []
    it = iter(args)
    for arg in it:
        if arg == "--allow-target":
            allowed.append(next(it, ""))
        elif arg.startswith("--allow-target="):
            allowed.append(arg.partition("=")[2])
        else:
            files.append(arg)
    if not files:
        sys.stderr.write(_USAGE)
        return 2
    failed = 0
    for path in files:
        try:
            cfg = load_config(path, allowed_targets=allowed)
        except ConfigError as exc:
            failed += 1
            sys.stdout.write(f"{exc}\n")
        else:
            from hyper_parallel.preflight import preflight_report

            sys.stdout.write(f"{path}: ok\n" + preflight_report(cfg))
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
    if command == "check":
        return _check(rest)
    if command == "schema" and not rest:
        sys.stdout.write(json.dumps(json_schema(TrainerConfig), indent=2) + "\n")
        return 0
    sys.stderr.write(_USAGE)
    return 2


if __name__ == "__main__":
    sys.exit(main())
