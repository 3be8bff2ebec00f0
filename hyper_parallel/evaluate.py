"""Held-out loss of a trained model: ``python -m hyper_parallel.evaluate --checkpoint PATH``.

``[--config-file C] [--GROUP.FIELD VALUE ...] [--json] [--allow-target PREFIX] [--strict]``

``--checkpoint`` may also name a Hugging Face folder ``hyper_parallel.export`` wrote (``config.json`` and
safetensors weights; a native model's or a transformers-path run's): its ``config.json`` is the model and
its weights are evaluated, with ``--config-file`` (required: the folder holds no run config) giving the
validation data, tokenizer and layout.

The config is ``--config-file``'s, else the one the run saved beside ``--checkpoint``'s weights
(``step-<N>/config.yaml``, of the newest complete step of a ``checkpoint.folder``), as ``generate`` and
``export`` read it. A vision-language model's checkpoint (``train_vl``'s) is refused in one line naming
its data, exit 2: validation feeds the model tokens only, not images, so its held-out loss is not
measured yet.

The validator's data (the config's ``validator`` section; it need not be enabled) goes through the model once
and the command prints the tokens counted, the mean loss and the perplexity: ``tokens N  loss X  perplexity
Y`` on one line, or with ``--json`` one JSON object with ``tokens``, ``loss`` and ``perplexity``. Under
torchrun each rank evaluates its share and rank 0 prints.

The figures are the validator's own: the trainer is built from the config exactly as for training (the same
layout, model, weights loading, validation loader and ``LossValidator.validate``), so evaluating the
checkpoint of step ``k`` gives what the validation record of step ``k`` logged during training. The
weights are those of ``--checkpoint`` (a ``step-<N>`` folder, or a ``checkpoint.folder`` whose newest step
that reads is used: a damaged one is skipped with a warning, as export and the trainer's resume skip it),
else that of the config's ``checkpoint.folder`` when checkpointing is enabled, else what training would
start from (``model.weights_path``, ``checkpoint.initial_load_path``, or the seed's initialisation).
Evaluation writes nothing: no checkpoint, metrics file, TensorBoard event or profile;
``training.max_steps`` is not read.

A config without a ``validator`` section (in the file or by overrides) evaluates the training data
instead, and says so on stderr: its held-out split (``dataloader.dataset.holdout_fraction`` of prepared
folders, ``split: holdout``), else, for data without one, the first ``validator.steps`` batches (8 unless
set) of the training data itself, in file order: a loss on data the model trained on, said as such.

Input errors (the config, an override, a checkpoint that is missing or damaged) print one line per problem
and exit 2, as ``train_lm`` does. torch is imported only once the config resolved.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from hyper_parallel._numbers import read_world_size
from hyper_parallel.config import ConfigError, Issue
from hyper_parallel.config.manager import ConfigReport, load_config_report
from hyper_parallel.launch import (
    EXIT_INPUT_ERROR,
    EXIT_TRAINING_ERROR,
    is_rank0,
    parse_arguments,
    report_issues,
)
from hyper_parallel.models import is_hf_folder
from hyper_parallel.trainer import rules
from hyper_parallel.trainer.machine import machine_issues

if TYPE_CHECKING:
    from hyper_parallel.trainer.config import TrainerConfig

__all__ = ["EvaluateError", "evaluate", "exported_config", "main"]

_USAGE = """usage: python -m hyper_parallel.evaluate [--config-file FILE] [--checkpoint PATH]
       [--GROUP.FIELD VALUE ...] [--json] [--strict] [--allow-target PREFIX]

Run the validator's data (the config's validator section) through the model once and print the tokens,
the mean loss and the perplexity. Under torchrun, each rank evaluates its share (torchrun --nproc-per-node 2
-m hyper_parallel.evaluate --config-file FILE ...).

options:
  --config-file FILE     the run's YAML config (default: the config.yaml saved beside --checkpoint's weights)
  --checkpoint PATH      a step-<N> folder, or a checkpoint.folder for its newest intact step (default: the
                         config's checkpoint.folder when checkpointing is enabled), or an exported
                         Hugging Face folder (with --config-file)
  --GROUP.FIELD VALUE    override one field, as for train_lm (e.g. --validator.steps 8)
  --json                 print one JSON object {"tokens": ..., "loss": ..., "perplexity": ...}
  --strict               refuse settings that make the run pointless (warnings) like errors, exit 2
  --allow-target PREFIX  also allow _target_ under this module prefix (repeatable)
  -h, --help             this text

exit status: 0 evaluated, 2 input error, 1 an error the message explains
"""

#: Launch options that mean nothing here.
_NOT_HERE = {
    "dry_run": "--dry-run",
    "no_file_checks": "--no-file-checks",
    "print_config": "--print-config",
    "dump_config": "--dump-config",
    "device_memory": "--device-memory",
    "world_size": "--world-size",
}


class EvaluateError(ValueError):
    """A checkpoint or config evaluation cannot use; the message is one line."""


def _own_options(argv: Sequence[str]) -> tuple[str | None, bool, list[str], list[Issue]]:
    """``--checkpoint PATH`` and ``--json`` taken out of ``argv``; the rest is the launch's."""
    checkpoint: str | None = None
    as_json = False
    rest: list[str] = []
    issues: list[Issue] = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        name, eq, value = token.partition("=")
        if name == "--json":
            if eq:
                issues.append(Issue("", "--json takes no value", "--json"))
            as_json = True
        elif name == "--checkpoint":
            if not eq:
                if i >= len(tokens) or tokens[i].startswith("--"):
                    issues.append(Issue("", "--checkpoint needs a value", "--checkpoint"))
                    continue
                value = tokens[i]
                i += 1
            if checkpoint is not None:
                issues.append(Issue("", "--checkpoint given twice; give it once", "--checkpoint"))
            checkpoint = value
        else:
            rest.append(token)
    return checkpoint, as_json, rest, issues


def _checkpoint_folder(cfg: TrainerConfig, checkpoint: str | None) -> Path | None:
    """The step folder or ``checkpoint.folder`` whose weights are evaluated (None: what training would
    start from)."""
    from hyper_parallel.components.checkpoint._layout import complete_steps

    if checkpoint is not None:
        return Path(checkpoint)
    folder = Path(cfg.checkpoint.folder)
    if not cfg.checkpoint.enable or not folder.is_dir() or not complete_steps(folder):
        return None
    return folder


def exported_config(cfg: TrainerConfig, folder: Path) -> tuple[TrainerConfig, str | None]:
    """``cfg`` evaluating the Hugging Face ``folder`` (an export), and what to tell the user: the model is
    the one the folder's ``config.json`` describes (``models.hf_folder_spec``: a native model or the
    transformers path) with the folder's weights, no checkpoint is read, and adapters the config trains
    are not added (the export merged them). ``EvaluateError`` (one line) for a folder of no model this
    project builds."""
    import attrs

    from hyper_parallel.components.peft import FullFineTuning
    from hyper_parallel.models import hf_folder_spec

    try:
        spec = hf_folder_spec(folder, recorded=True)
    except ValueError as exc:
        raise EvaluateError(str(exc)) from None
    note = None
    if cfg.peft.trains_adapters:
        note = f"{folder} holds the weights with the run's adapters merged: evaluated without peft"
    whole = FullFineTuning.Config() if cfg.peft.trains_adapters else cfg.peft
    return attrs.evolve(cfg, model=spec, checkpoint=type(cfg.checkpoint)(), peft=whole), note


def vision_language_refusal(cfg: TrainerConfig) -> str:
    """Why ``cfg``'s vision-language model is not evaluated: one line naming the data train_vl feeds it."""
    dataset = getattr(cfg.dataloader, "dataset", None)
    source = getattr(dataset, "source", None)
    image_data = getattr(dataset, "image_data", None)
    data = f"{source!r} data" if image_data is None else f"{source!r}, {image_data}"
    return (
        f"{cfg.model.name!r} is a vision-language model, trained by train_vl (its data: {data}), which "
        "evaluate cannot run yet (validation feeds the model tokens, not images): its held-out loss is "
        "not measured here"
    )


def checkpoint_config(checkpoint: str | None) -> str:
    """The config saved beside the weights ``checkpoint`` names (a ``step-<N>`` folder, or a
    ``checkpoint.folder`` for its newest complete step), as ``generate`` and ``export`` read it when no
    ``--config-file`` is given; ``EvaluateError`` when there is none."""
    from hyper_parallel.components.checkpoint._layout import CONFIG_FILE, complete_steps, step_folder

    if checkpoint is None:
        raise EvaluateError("give --config-file FILE, or --checkpoint PATH whose config.yaml is read")
    folder = Path(checkpoint)
    if not folder.is_dir():
        raise EvaluateError(f"{checkpoint!r}: no such folder")
    steps = complete_steps(folder)
    step = step_folder(folder, steps[-1]) if steps and not (folder / CONFIG_FILE).is_file() else folder
    config = step / CONFIG_FILE
    if not config.is_file():
        raise EvaluateError(
            f"{str(step)!r} holds no {CONFIG_FILE} (saved by an older version, or no checkpoint): pass the "
            "run's config with --config-file"
        )
    return str(config)


def _refuse_oversized(cfg: TrainerConfig, step: Path, metadata: Any) -> None:
    """Refuse a config whose model is larger than the checkpoint stores, before the trainer builds it."""
    import math

    from hyper_parallel.export import base_size_problem, stored_model_sizes
    from hyper_parallel.models import size_problem

    if not cfg.peft.checkpoint_holds_base(cfg.model.weights_path):
        # LoRA's adapters alone: the base is built again, sized by its weights folder (or base.json's
        # count) first; the trainer checks the adapters' shapes
        base_problem = base_size_problem(step, cfg)
        if base_problem is not None:
            raise EvaluateError(base_problem)
        return
    stored = sum(math.prod(size) for size in stored_model_sizes(metadata).values())
    problem = size_problem(cfg.model.args, stored)
    if problem is not None:
        raise EvaluateError(f"{step / '.metadata'}: {problem}")


def evaluate(
    cfg: TrainerConfig, *, checkpoint: str | Path | None = None, stream: TextIO | None = None
) -> dict[str, float]:
    """``{"tokens", "loss", "perplexity", "batches"}`` of the validator's data through the model, once.

    ``cfg`` is the run's config; its ``validator`` section says what to evaluate (enabled or not).
    ``checkpoint`` and the weights otherwise used are as in the module docstring; whatever the trainer
    prints (``debug.print_config``) goes to ``stream`` (default stderr). Call it on every rank
    of a torchrun launch. Raises ``EvaluateError`` for a checkpoint that cannot be
    used, and the trainer's errors (``ConfigError`` for a bad file the config names, ``TrainingError``)
    as training does.

    A checkpoint folder's steps are searched as export's are (``_newest.newest_readable``): a step that
    fails when read is skipped with a warning for the next older one, one pruned while it was read makes
    the folder be listed again. The trainer is built once, when the first step passes its inspection and
    the size check, and each step tried is read into its model.
    """
    from hyper_parallel.components.checkpoint._layout import step_of
    from hyper_parallel.components.checkpoint._newest import NoReadableStepError, newest_readable
    from hyper_parallel.components.checkpoint._safe_read import inspect
    from hyper_parallel.trainer import LLMTrainer, Trainer
    from hyper_parallel.trainer._agreement import step_disagreement

    stream = stream if stream is not None else sys.stderr
    folder = _checkpoint_folder(cfg, None if checkpoint is None else str(checkpoint))
    built: list[Trainer] = []

    def build(start: str | None) -> Trainer:
        built.append(LLMTrainer(_evaluated(cfg, start), stream=stream))
        return built[0]

    def read(step: Path) -> None:  # every rank: DCP gathers a failed read, so every rank falls back alike
        _refuse_oversized(cfg, step, inspect(step, digests=False).metadata)  # before the model is built
        made = built[0] if built else build(None)
        made.checkpointer.load_model_from(step)

    try:
        if folder is None:
            made = build(cfg.checkpoint.initial_load_path)
        else:
            try:
                step, _ = newest_readable(folder, read, purpose="evaluate")
            except NoReadableStepError as exc:
                raise EvaluateError(str(exc)) from None
            made = built[0]
            # Each rank listed the folder on its own: a save and a prune between two listings of a live
            # folder would mix two steps' weights. The ranks compare what they read, as training does.
            problem = step_disagreement(step_of(step), str(folder))
            if problem is not None:
                raise EvaluateError(problem)
        with made.autocast():  # the model computes as in training
            results: dict[str, float] = made.validator.validate(made.model, made.step)
    finally:
        for made in built:
            made.close()
    return results


def _evaluated(cfg: TrainerConfig, start: str | None) -> TrainerConfig:
    """``cfg`` as evaluation builds it: the validator on, nothing written, the weights of ``start`` alone."""
    import attrs

    # Reads the weights of initial_load_path alone and never saves: a checkpoint section with nothing else
    # (the saving options of a sink that is off are refused).
    kind = type(cfg.checkpoint)
    store = kind() if start is None else kind(initial_load_path=start, initial_load_model_only=True)
    return attrs.evolve(
        cfg,
        validator=attrs.evolve(cfg.validator, enable=True),  # built; called once below, whatever freq says
        checkpoint=store,
        metrics=type(cfg.metrics)(),  # the defaults write no file
        profiler=type(cfg.profiler)(),
    )


def _line(results: dict[str, float], as_json: bool) -> str:
    tokens = int(results["tokens"])
    loss, perplexity = results["loss"], results["perplexity"]
    if as_json:
        shown = perplexity if math.isfinite(perplexity) else None  # JSON has no Infinity
        return json.dumps({"tokens": tokens, "loss": loss, "perplexity": shown})
    return f"tokens {tokens}  loss {loss:.4f}  perplexity {perplexity:.4f}"


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """The command line; returns the exit status (0 evaluated, 2 an input error, 1 a training error)."""
    out = out or sys.stdout
    err = err or sys.stderr
    checkpoint, as_json, rest, issues = _own_options(list(sys.argv[1:] if argv is None else argv))
    args, more = parse_arguments(rest)
    issues += more
    if args.help:
        out.write(_USAGE)
        return 0
    issues += [
        Issue("", f"{flag} is not an option of evaluate", flag)
        for key, flag in _NOT_HERE.items()
        if getattr(args, key)
    ]
    exported = checkpoint is not None and is_hf_folder(Path(checkpoint))
    if exported and args.config_file is None and not issues:
        message = (
            f"{checkpoint!r} is a Hugging Face folder (an export), which holds no run config: give "
            "--config-file FILE (the run's config.yaml: its validation data and tokenizer)"
        )
        issues.append(Issue("", message, "--checkpoint"))
    if args.config_file is None and not issues:
        try:
            args.config_file = checkpoint_config(checkpoint)
        except EvaluateError as exc:
            issues.append(Issue("", str(exc), "--checkpoint" if checkpoint else "command line"))
    if issues:
        return report_issues(issues, err)
    assert args.config_file is not None
    text = os.environ.get("WORLD_SIZE", "1")
    world_size = read_world_size(text)
    if world_size is None:
        return report_issues(
            [Issue("", f"world size must be a positive integer, got {text.strip()!r}", "$WORLD_SIZE")], err
        )
    config_file = args.config_file

    def resolve() -> ConfigReport:
        return load_config_report(
            config_file,
            args.overrides,
            allowed_targets=args.allow_target,
            world_size=world_size,
            strict=args.strict,
            command_line=True,
        )

    try:
        loaded = resolve()
    except ConfigError as exc:
        return report_issues(exc.issues, err)
    cfg = loaded.config
    if exported:  # the folder's own model and weights, not the run's (nor its checkpoint.folder)
        assert checkpoint is not None
        try:
            cfg, merged = exported_config(cfg, Path(checkpoint))
        except EvaluateError as exc:
            err.write(f"evaluate: {exc}\n")
            return EXIT_INPUT_ERROR
        if merged is not None and is_rank0():
            err.write(f"evaluate: {merged}\n")
        checkpoint = None
    if rules.trainer_kind(cfg) == "vl":
        err.write(f"evaluate: {vision_language_refusal(cfg)}\n")
        return EXIT_INPUT_ERROR
    # What train_lm and this machine refuse, refused alike.
    refused = [*rules.trainer_issues(cfg, "lm"), *machine_issues(cfg, training=True)]
    if refused:
        return report_issues(loaded.located(refused, args.config_file), err)
    if cfg.model.awaits_weights:  # a Hub id the file checks just fetched: its snapshot, as the launch
        try:
            loaded = resolve()
        except ConfigError as exc:
            return report_issues(exc.issues, err)
        cfg = loaded.config
    if not cfg.validator.enable and ("validator",) not in loaded.given:
        fallback = training_data_validator(cfg)
        if fallback is None:
            message = (
                "names no validation data to evaluate: add a validator section with its dataset (enable may "
                "stay false), or override it, e.g. --validator.dataset.source python_docs --validator.steps 8"
            )
            return report_issues([Issue("validator", message, args.config_file)], err)
        cfg, note = fallback
        if is_rank0():
            err.write(f"evaluate: {note}\n")
    # The config's warnings are about training (steps, logging, schedule), which evaluation does not run.
    return _run(cfg, checkpoint, as_json, out, err)


#: Batches of the training data evaluated when it has no held-out split and validator.steps is -1.
FALLBACK_STEPS = 8


def training_data_validator(cfg: TrainerConfig) -> tuple[TrainerConfig, str] | None:
    """``cfg`` evaluating its training data, and what to tell the user; None without a training dataset.

    The held-out split of prepared folders when ``holdout_fraction`` sets one apart; else the first
    ``validator.steps`` batches (:data:`FALLBACK_STEPS` for the whole set, -1) of the training data itself,
    in file order (validation never shuffles, so the dataset's shuffle seed is left out unless the data is
    generated from it).
    """
    import attrs

    dataset = getattr(cfg.dataloader, "dataset", None)
    if dataset is None or not dataset.names_data or not hasattr(cfg.validator, "dataset"):
        return None
    steps = cfg.validator.steps
    split = dataset.held_out()
    if split is not None:
        held, share = split
        note = f"no validator section: evaluating the training data's held-out split ({share})"
    else:
        steps = FALLBACK_STEPS if steps == -1 else steps
        held = dataset.in_file_order()
        note = (
            f"no validator section, and the training data ({dataset.source!r}) has no held-out split "
            "(dataloader.dataset.holdout_fraction of prepared folders): evaluating the first "
            f"{steps} batches of the training data itself, which the model may have trained on"
        )
    validator = attrs.evolve(cfg.validator, dataset=held, steps=steps)  # type: ignore[call-arg]
    return attrs.evolve(cfg, validator=validator), note


def _run(cfg: TrainerConfig, checkpoint: str | None, as_json: bool, out: TextIO, err: TextIO) -> int:
    from hyper_parallel.trainer import TrainingError

    try:
        results = evaluate(cfg, checkpoint=checkpoint, stream=err)
    except (EvaluateError, OSError) as exc:  # OSError: a checkpoint.initial_load_path that is not there
        if is_rank0():
            err.write(f"evaluate: {exc}\n")
        return EXIT_INPUT_ERROR
    except ConfigError as exc:
        if is_rank0():
            err.write(f"{exc}\n")
        return EXIT_INPUT_ERROR
    except (TrainingError, ValueError) as exc:
        if is_rank0():
            err.write(f"evaluate: {exc}\n")
        return int(getattr(exc, "exit_status", EXIT_TRAINING_ERROR))
    if is_rank0():
        out.write(_line(results, as_json) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    from hyper_parallel._cli import run

    run(main)
