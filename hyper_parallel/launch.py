"""The launch command line shared by ``train_lm`` and ``train_vl``.

``--config-file FILE`` plus typed dotted overrides (``--optimizer.lr 1e-4`` or ``--optimizer.lr=1e-4``),
resolved into one checked ``TrainerConfig`` before anything is built. An input error prints every issue as
``FILE:LINE:COL: PATH: MESSAGE`` and exits 2 (under torchrun only rank 0 prints; every rank exits 2).
Otherwise the config goes to ``LLMTrainer`` (``train_lm``) or ``VLTrainer`` (``train_vl``), which trains.
A file the config names that turns out wrong once the run reads it (data, tokenizer, weights, a checkpoint
of another model, a full disk) is an input error too: the trainer raises an ``InputFileError`` where it
reads the file, printed here once as ``FILE: problem`` (rank 0), exit status 2, no traceback.
"""

import os
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from hyper_parallel._cli import collection_paused
from hyper_parallel._numbers import read_world_size
from hyper_parallel.config import ConfigError, Issue, converter, dump_config, write_config
from hyper_parallel.config.help import config_help, group_of_field, summary
from hyper_parallel.config.manager import ConfigReport, load_config_report, located_issues
from hyper_parallel.config.root import foreign_hint
from hyper_parallel.config.targets import ALLOWED_TARGETS_ENV
from hyper_parallel.errors import did_you_mean, echo, warning_line
from hyper_parallel.trainer import rules
from hyper_parallel.trainer.config import TrainerConfig
from hyper_parallel.trainer.machine import machine_issues, machine_warnings

if TYPE_CHECKING:
    from hyper_parallel.config.validation import Locate
    from hyper_parallel.preflight import Device
    from hyper_parallel.trainer.rules import TrainerKind

__all__ = [
    "EXIT_INPUT_ERROR",
    "EXIT_TRAINING_ERROR",
    "is_rank0",
    "main",
    "parse_arguments",
    "report_issues",
    "warn_issues",
]

#: Exit status for any input error (bad file, bad flag, bad value), on every rank.
EXIT_INPUT_ERROR = 2
#: Exit status when training stopped on an error the message explains (non-finite loss, unreadable data).
EXIT_TRAINING_ERROR = 1

_FLAGS = (
    "--config-file",
    "--dry-run",
    "--no-file-checks",
    "--strict",
    "--print-config",
    "--dump-config",
    "--world-size",
    "--allow-target",
    "--device-memory",
    "--help",
)
#: The trainer each launch command feeds (the resolver checks the config against it).
_TRAINERS: dict[str, "TrainerKind"] = {"train_lm": "lm", "train_vl": "vl"}
_SWITCHES = frozenset({"--dry-run", "--no-file-checks", "--strict", "--print-config", "--help"})
#: Options of other tools (Hydra, TorchTitan) and what this command line calls them.
_MEANT_FLAGS = {
    "--config": "--config-file",
    "--config-name": "--config-file",
    "--config-path": "--config-file",
}
#: A Hydra-style override given as an argument: ``optimizer.lr=1e-3``, ``+group.field=v``, ``~group.field``.
_HYDRA_OVERRIDE = re.compile(r"([+~]?)([A-Za-z_]\w*(?:\.[A-Za-z_]\w*(?:\[\d+\])*)+)(?:=(.*))?", re.DOTALL)


def _argument_issue(token: str) -> Issue:
    """An argument that is not an option; a Hydra-style override is shown as this command line writes it."""
    message = f"unexpected argument {echo(token)}; options start with '--'"
    match = _HYDRA_OVERRIDE.fullmatch(token)
    if match and (match.group(3) is not None or match.group(1) == "~"):
        sign, path, value = match.groups()
        if sign == "~":
            message += f"; did you mean '--~{path}'?"
        elif value is not None:
            shown = value if value and " " not in value else echo(value)
            message += f"; did you mean '--{path} {shown}'?"
    return Issue("", message, "command line")


def _option_issue(name: str) -> Issue:
    """An unknown option without a dot: another tool's name for one of ours, or a field without its group."""
    field = name[2:].replace("-", "_")
    group = group_of_field(converter, TrainerConfig, field) if field.isidentifier() else None
    foreign = foreign_hint(converter.root_facts(TrainerConfig), field, None, flag=True)
    if name in _MEANT_FLAGS:
        hint = f"; did you mean {_MEANT_FLAGS[name]!r}?"
    elif group is not None:
        hint = f"; it is a field of {group!r} (--{group}.{field})"
    elif foreign:  # another tool's name for a field ('--learning_rate')
        hint = foreign
    else:
        hint = did_you_mean(name, _FLAGS) or "; overrides are dotted, e.g. --optimizer.lr"
    return Issue("", f"unknown option {echo(name)}{hint}", name)


def _usage(prog: str) -> str:
    return f"""usage: python -m hyper_parallel.{prog} --config-file FILE [--GROUP.FIELD VALUE ...]
       [--dry-run [--no-file-checks]] [--strict] [--print-config] [--dump-config PATH] [--world-size N]
       [--allow-target PREFIX] [--device-memory SIZE|DEVICE]

Resolve FILE into one typed, validated TrainerConfig, apply the overrides, and train. Launch several
processes with torchrun (torchrun --nproc-per-node 2 -m hyper_parallel.{prog} --config-file FILE).

options:
  --config-file FILE     YAML config; each root group names its Config class or factory with _target_
  --GROUP.FIELD VALUE    override one field (also --GROUP.FIELD=VALUE); VALUE is read by the field's type:
                         ints '200', floats '1e-4', bools 'true'/'false', lists '[1, 2]', 'null' for none;
                         --GROUP._target_ NAME switches the implementation
  --~GROUP.FIELD         remove a value the file set: the field takes its default again
  --dry-run              resolve and validate, check the files it names as the launch does (all but the
                         weights' tensors), print a summary, exit 0 (nothing is built)
  --no-file-checks       with --dry-run: leave the files out (a config checked away from its files)
  --strict               refuse settings that make the run pointless (warnings) like errors, exit 2
  --print-config         print the resolved config as YAML (it loads back to an equal config)
  --dump-config PATH     write that YAML to PATH atomically (never the config file itself)
  --world-size N         check the parallel degrees against N processes (default: $WORLD_SIZE)
  --allow-target PREFIX  also allow _target_ under this module prefix (repeatable; or ${ALLOWED_TARGETS_ENV})
  --device-memory SIZE   refuse a layout whose per-rank memory estimate exceeds SIZE (80GiB = 80 * 2^30,
                         80GB = 80 * 10^9) or a device: H100, H200, A100-40GB, A100-80GB, Ascend-910B
  -h, --help             this text; with --config-file, every overridable field with type, value and help

exit status: 0 success, {EXIT_INPUT_ERROR} input error, {EXIT_TRAINING_ERROR} training error,
             128 + N stopped by signal N (SIGINT 130, SIGTERM 143) after saving a checkpoint
"""


class _Args:
    def __init__(self) -> None:
        self.config_file: str | None = None
        self.dry_run = False
        self.no_file_checks = False
        self.strict = False
        self.print_config = False
        self.help = False
        self.dump_config: str | None = None
        self.world_size: str | None = None
        self.device_memory: str | None = None
        self.allow_target: list[str] = []
        self.overrides: dict[str, str | None] = {}


def parse_arguments(argv: Sequence[str]) -> tuple[_Args, list[Issue]]:
    """The launch options and overrides of ``argv`` and the problems found (for commands sharing them)."""
    args = _Args()
    issues: list[Issue] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token == "-h":
            token = "--help"
        if not token.startswith("--") or token == "--":
            issues.append(_argument_issue(token))
            continue
        name, eq, value = token.partition("=")
        if name in _SWITCHES:
            if eq:
                issues.append(Issue("", f"{name} takes no value", name))
            setattr(args, name[2:].replace("-", "_"), True)
            continue
        if name.startswith("--~"):  # Hydra's delete ('--~group.field') takes no value
            args.overrides[name[2:]] = value if eq else None
            continue
        if name not in _FLAGS and "." not in name:
            issues.append(_option_issue(name))
            if not eq and i < len(argv) and not argv[i].startswith("--"):
                i += 1  # its value: one problem, not two
            continue
        if not eq:
            if i >= len(argv) or (argv[i].startswith("--") and len(argv[i]) > 2):
                issues.append(Issue("", f"{name} needs a value", name))
                continue
            value = argv[i]
            i += 1
        if name == "--allow-target":
            args.allow_target.append(value)
        elif name in ("--config-file", "--dump-config", "--world-size", "--device-memory"):
            before = getattr(args, name[2:].replace("-", "_"))
            if before is not None:
                message = f"{name} given twice ({echo(before)}, then {echo(value)}); give it once"
                issues.append(Issue("", message, name))
            setattr(args, name[2:].replace("-", "_"), value)
        else:
            args.overrides[name[2:]] = value
    return args, issues


def _world_size(args: _Args, issues: list[Issue]) -> int | None:
    text, origin = args.world_size, "--world-size"
    if text is None:
        text, origin = os.environ.get("WORLD_SIZE"), "$WORLD_SIZE"
    if text is None:
        return None
    world_size = read_world_size(text)
    if world_size is None:
        issues.append(Issue("", f"world size must be a positive integer, got {echo(text)}", origin))
    return world_size


def is_rank0() -> bool:
    """Whether this process is rank 0 of a torchrun launch (or not under torchrun at all)."""
    rank = os.environ.get("RANK", "0")
    return rank.strip() in ("", "0")


def warn_issues(issues: Sequence[Issue], err: TextIO) -> None:
    """Print the config's warnings once (rank 0), each at its location, as compilers do."""
    if not issues or not is_rank0():
        return
    for issue in issues:
        err.write(warning_line(issue) + "\n")
    count = len(issues)
    err.write(f"{count} warning{'s' if count != 1 else ''} (--strict refuses them)\n")


def report_issues(issues: Sequence[Issue], err: TextIO, skipped: Sequence[tuple[str, str]] = ()) -> int:
    """Print input errors on rank 0 as a launch does, then (one line) the checks they made meaningless
    (``skipped``: :attr:`ConfigError.skipped`); returns ``EXIT_INPUT_ERROR``."""
    if is_rank0():
        err.write(f"{ConfigError(issues)}\n")
        if skipped:
            err.write(f"not checked: {_skipped_text(skipped)}\n")
        count = len(issues)
        err.write(f"{count} problem{'s' if count != 1 else ''} found; nothing was started.\n")
    return EXIT_INPUT_ERROR


def _skipped_text(skipped: Sequence[tuple[str, str]]) -> str:
    """``checks (why); checks and checks (why)``: the checks of each reason together, in their order."""
    by_reason: dict[str, list[str]] = {}
    for checks, why in skipped:
        by_reason.setdefault(why, []).append(checks)
    return "; ".join(f"{' and '.join(checks)} ({why})" for why, checks in by_reason.items())


def main(
    argv: Sequence[str] | None = None,
    *,
    prog: str = "train_lm",
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run the launch command line; returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    with collection_paused():  # reading the config makes long-lived objects, no garbage worth a collection
        checked = _checked(argv, prog, out, err)
    if isinstance(checked, int):
        return checked
    return _train(checked, prog, out, err)


def _checked(argv: Sequence[str] | None, prog: str, out: TextIO, err: TextIO) -> "int | TrainerConfig":
    """Everything before training: the command line read, the config resolved, checked and printed as
    asked; the exit status when that is all there is to do, else the config to train with."""
    args, issues = parse_arguments(list(sys.argv[1:] if argv is None else argv))
    if args.help and args.config_file is None:
        out.write(_usage(prog))
        return 0
    if args.config_file is None and not issues:
        issues.append(Issue("", "--config-file FILE is required", "command line"))
    world_size = _world_size(args, issues)
    if args.no_file_checks and not args.dry_run:
        issues.append(Issue("", "only leaves files out of a --dry-run; add --dry-run", "--no-file-checks"))
    if args.dump_config and args.config_file and _same_file(args.dump_config, args.config_file):
        issues.append(Issue("", "refusing to overwrite the config file it was given", "--dump-config"))
    if issues:
        return report_issues(issues, err)
    assert args.config_file is not None
    training = not (args.dry_run or args.print_config or args.dump_config or args.help)
    if training and world_size is None:
        world_size = 1  # a plain `python -m` launch is one process; torchrun exports WORLD_SIZE
    files = training or (args.dry_run and not args.no_file_checks)
    config_file = args.config_file

    def resolve() -> ConfigReport:
        return load_config_report(
            config_file,
            args.overrides,
            allowed_targets=args.allow_target,
            world_size=world_size,
            strict=args.strict,
            command_line=True,
            trainer=_TRAINERS.get(prog),
        )

    try:
        loaded = resolve()
    except ConfigError as exc:  # what the launch checks next, on what could be made: in the same report
        warn_issues(exc.warnings, err)
        issues, skipped = _later_checks(exc, args.config_file, training=training, files=files)
        return report_issues(issues, err, skipped)
    try:
        cfg = loaded.config
        source = args.config_file
        launch = _launch_issues(cfg, frozenset(), loaded.locate, source, training=training, files=files)
        # A run or its dry-run (not a dump or a help): only the resolve knows whether checkpoint.enable:
        # false was written (the file or a flag).
        chosen = ("checkpoint", "enable") in loaded.given
        found = rules.unsaved_fine_tune(cfg, off_by_choice=chosen) if training or args.dry_run else ()
        unsaved = loaded.located(found, source)
        if not chosen:
            launch += unsaved
        if launch:
            raise ConfigError(launch)
        if training and cfg.model.awaits_weights:  # a Hub id the file checks just fetched: its snapshot
            loaded = resolve()
            cfg = loaded.config
        if files and not training:  # the launch runs these itself, after the process group starts
            from hyper_parallel.trainer._inputs import check_without_torch

            try:
                check_without_torch(cfg)
            except ConfigError as exc:  # printed as the launch prints it (see _train)
                if is_rank0():
                    err.write(f"{exc}\n")
                return EXIT_INPUT_ERROR
        costly = [Issue(path, message, args.config_file) for path, message in machine_warnings(cfg)]
        if costly and args.strict:
            raise ConfigError(costly)
        device = _device_memory_check(cfg, world_size, args.device_memory)
        if args.help:
            out.write(_usage(prog))
            out.write("\n" + config_help(cfg, converter=converter))
            return 0
        if args.dump_config is not None:
            write_config(cfg, args.dump_config)
        if args.print_config:
            out.write(dump_config(cfg))
    except ConfigError as exc:
        warn_issues(exc.warnings, err)
        return report_issues(exc.issues, err)
    warn_issues([*loaded.warnings, *costly, *(unsaved if chosen else ())], err)
    if args.dry_run:
        if not args.print_config and is_rank0():
            from hyper_parallel.preflight import preflight_report

            summary_text = summary(
                cfg, source=args.config_file, world_size=world_size, given=loaded.given, converter=converter
            )
            from hyper_parallel.preflight.run_length import run_length

            out.write(summary_text)
            out.write(run_length(cfg, world_size, files=files))
            out.write(preflight_report(cfg, world_size, device))
        return 0
    if args.print_config or args.dump_config:
        return 0
    return cfg


def _train(cfg: TrainerConfig, prog: str, out: TextIO, err: TextIO) -> int:
    """Build the trainer of ``prog`` and train; the exit status says how it ended."""
    from hyper_parallel.trainer import LLMTrainer, TrainingError, VLTrainer

    trainer_class = VLTrainer if _TRAINERS.get(prog) == "vl" else LLMTrainer
    trainer = None
    try:
        trainer = trainer_class(cfg, stream=out)
        try:
            trainer.train()
        finally:
            trainer.close()  # inside the try: its final barrier may time out too (CollectiveError)
    except ConfigError as exc:  # a file the config names, found wrong once the run started: FILE: problem
        if is_rank0():
            err.write(f"{exc}\n")
        return EXIT_INPUT_ERROR
    except TrainingError as exc:
        # a collective cut short by a stalled rank (CollectiveError) is told by each rank that saw it
        if is_rank0() or getattr(exc, "every_rank", False):
            err.write(f"training stopped: {exc}\n")
        # ranks that disagree (RanksDisagreeError) are an input error: exit 2
        return int(getattr(exc, "exit_status", EXIT_TRAINING_ERROR))
    stopped = trainer.stopped_by_signal
    if not stopped:
        return 0
    import signal  # the trainer has it loaded already; a dry run never gets here

    return 128 + int(signal.Signals[stopped])


#: The root groups the checks of the files a config names read (``trainer._inputs``, ``machine``).
_FILE_GROUPS = ("model", "tokenizer", "training", "dataloader", "validator")


def _later_checks(
    exc: ConfigError, source: str, *, training: bool, files: bool
) -> tuple[list[Issue], list[tuple[str, str]]]:
    """The issues of ``exc`` and what the launch's own checks find in the config that could be made
    despite them (``exc.config``): this machine, the model's size and, when asked, the files it names,
    each run only where the groups it reads were made; and ``exc.skipped`` with the checks left out."""
    from hyper_parallel.config.manager import NO_CONFIG, unmade_reason

    issues, skipped = list(exc.issues), list(exc.skipped)
    made = exc.config
    if made is None:  # (a document that could not be read at all skipped everything: no line for that)
        if files and skipped:
            skipped.append(("the files the config names", NO_CONFIG))
        return issues, skipped
    unmade = exc.unmade
    unmade_files = [g for g in _FILE_GROUPS if g in unmade]
    reads_files = files and not unmade_files
    found = _launch_issues(made, unmade, exc.locate, source, training=training, files=reads_files)
    known = {(i.path, str(i.message)) for i in issues}
    issues += [i for i in found if (i.path, str(i.message)) not in known]
    if files and unmade_files:
        skipped.append(("the files the config names", unmade_reason(unmade_files)))
    elif files and not training and not found:  # (as below: once this machine has what they read)
        from hyper_parallel.trainer._inputs import check_without_torch

        try:
            check_without_torch(made)
        except ConfigError as found_in_files:  # (the tokenizer's size may be a rule's finding already)
            said = {str(i.message) for i in issues}
            issues += [i for i in found_in_files.issues if str(i.message) not in said]
    return issues, skipped


def _launch_issues(
    cfg: "TrainerConfig",
    unmade: frozenset[str],
    locate: "Locate | None",
    source: str,
    *,
    training: bool,
    files: bool,
) -> list[Issue]:
    """What the launch checks of a resolved config itself, on the groups that were made (none of
    ``unmade``'s): this machine (``machine_issues``; with ``files``, the files it reads first), located as the
    resolver locates its issues, and a model more parameters than any machine holds (``preflight.limits``),
    at ``source``."""
    from hyper_parallel.preflight.limits import size_issues

    found = machine_issues(cfg, training=training, files=files)
    machine = [(path, message) for path, message in found if path.partition(".")[0] not in unmade]
    size = size_issues(cfg) if "model" not in unmade else []
    at_source = [Issue(path, message, source) for path, message in size]
    return [*located_issues(machine, locate, source), *at_source]


def _device_memory_check(cfg: "TrainerConfig", world_size: int | None, text: str | None) -> "Device | None":
    """``--device-memory``: the device, or a ``ConfigError`` when the estimate per rank exceeds it."""
    if text is None:
        return None
    from hyper_parallel.preflight import memory_issues, parse_device

    try:
        device = parse_device(text)
    except ValueError as exc:
        raise ConfigError([Issue("", str(exc), "--device-memory")]) from None
    problems = memory_issues(cfg, world_size, device)
    if problems:
        raise ConfigError([Issue(path, message, "--device-memory") for path, message in problems])
    return device


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)
