"""What a user reads (issue 12, points 4, 5, 12, 14): warnings for runs that are pointless but not wrong,
every problem at once, messages in the project's words, and the ``--dry-run`` summary."""

import io
import warnings
from pathlib import Path
from typing import Any

import pytest

from hyper_parallel.config import (
    ConfigError,
    ConfigWarning,
    Issue,
    apply_overrides,
    load_config,
    resolve_root,
)
from hyper_parallel.config.manager import load_config_report
from hyper_parallel.launch import main

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted(p.name for p in (REPO / "configs").glob("*.yaml"))
QWEN = "hyper_parallel.models.qwen3_5.create_model_spec"
ADAMW = "hyper_parallel.components.optimizer.AdamW.Config"
SCHED = "hyper_parallel.components.lr_scheduler.WarmupDecay.Config"
TRAINING = "hyper_parallel.trainer.config.TrainingConfig"
METRICS = "hyper_parallel.components.metrics.MetricsLogger.Config"
VALIDATOR = "hyper_parallel.components.validator.LossValidator.Config"
PROFILER = "hyper_parallel.components.profiler.TorchProfiler.Config"
CHECKPOINT = "hyper_parallel.components.checkpoint.DCPCheckpoint.Config"


@pytest.fixture(autouse=True)
def _at_the_repository_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def launch(*argv: str, prog: str = "train_lm") -> tuple[int, str, str]:
    if "--dry-run" in argv:  # the shipped configs name placeholder files: check the config alone
        argv = (*argv, "--no-file-checks")
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), prog=prog, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def report(issues: Any) -> list[tuple[str | None, str, str]]:
    return [(i.location, i.path, i.message) for i in issues]


def text(*groups: str) -> str:
    return f"model:\n  _target_: {QWEN}\n  weights_path: /w\n" + "".join(groups)


# --- point 4: warnings, not errors -------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_config_dry_runs_with_ten_steps(name: str) -> None:
    prog = "train_vl" if "_vl" in name else "train_lm"
    status, out, err = launch(
        "--config-file", f"configs/{name}", "--training.max_steps", "10", "--dry-run", prog=prog
    )
    assert status == 0, err
    assert all(": warning: " in line for line in err.splitlines()[:-1]), err
    assert "all checks passed" in out


WARNINGS = [
    pytest.param(
        f"lr_scheduler:\n  _target_: {SCHED}\n  warmup_steps: 200\n",
        ("<doc>:6:17", "lr_scheduler.warmup_steps", "must be <= training.max_steps (100), got 200"),
        id="warmup-longer-than-the-run",
    ),
    pytest.param(
        f"lr_scheduler:\n  _target_: {SCHED}\n  warmup_steps: 50\n  decay_ratio: 0.6\n",
        (
            "<doc>:7:16",
            "lr_scheduler.decay_ratio",
            "warmup_steps (50) plus the decay phase (60 steps = decay_ratio x 100) exceeds "
            "training.max_steps (100); the decay is shortened to 50 steps",
        ),
        id="decay-does-not-fit",
    ),
    pytest.param(
        f"validator:\n  _target_: {VALIDATOR}\n  enable: true\n  freq: 500\n",
        (
            "<doc>:7:9",
            "validator.freq",
            "validation would never run: freq (500) exceeds training.max_steps (100)",
        ),
        id="validation-never-runs",
    ),
    pytest.param(
        f"profiler:\n  _target_: {PROFILER}\n  enable: true\n  profile_freq: 200\n",
        (
            "<doc>:7:17",
            "profiler.profile_freq",
            "no trace would be captured: profile_freq (200) exceeds training.max_steps (100)",
        ),
        id="profiler-never-captures",
    ),
    pytest.param(
        f"metrics:\n  _target_: {METRICS}\n  log_freq: 500\n",
        (
            "<doc>:6:13",
            "metrics.log_freq",
            "no metrics would be logged: log_freq (500) exceeds training.max_steps (100)",
        ),
        id="metrics-never-logged",
    ),
]
RUN = f"training:\n  _target_: {TRAINING}\n  max_steps: 100\n"


@pytest.mark.parametrize(("group", "expected"), WARNINGS)
def test_a_pointless_setting_is_a_warning_that_strict_refuses(
    group: str, expected: tuple[str, str, str]
) -> None:
    doc = text(group, RUN)
    with pytest.warns(ConfigWarning) as caught:
        cfg = load_config("<doc>", text=doc)
    assert [report([w.message.issue]) for w in caught.list] == [[expected]]  # type: ignore[union-attr]
    assert report(load_config_report("<doc>", text=doc).warnings) == [expected]
    with pytest.raises(ConfigError) as info:
        load_config("<doc>", text=doc, strict=True)
    assert report(info.value.issues) == [expected]
    assert cfg.training.max_steps == 100


def test_a_warning_points_at_the_callers_line() -> None:
    cfg = load_config("configs/llama3_debug.yaml")
    with pytest.warns(ConfigWarning) as caught:
        apply_overrides(cfg, {"training.max_steps": "5"})
    assert [(Path(w.filename).name, str(w.message)) for w in caught.list] == [
        (
            Path(__file__).name,
            "metrics.log_freq: no metrics would be logged: log_freq (10) exceeds training.max_steps "
            "(5, set by overrides['training.max_steps'])",
        )
    ]


def test_no_warning_for_a_sound_config() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config("configs/qwen3_5_full.yaml")


WARMUP = (
    "configs/llama3_8b.yaml:33:17: warning: lr_scheduler.warmup_steps: must be <= training.max_steps "
    "(10, set by --training.max_steps), got 200"
)


def test_dry_run_prints_each_warning_at_its_location_once() -> None:
    status, out, err = launch(
        "--config-file", "configs/llama3_8b.yaml", "--training.max_steps", "10", "--dry-run"
    )
    assert status == 0
    assert err.splitlines() == [WARMUP, "1 warning (--strict refuses them)"]
    assert out.startswith("resolved configs/llama3_8b.yaml: 17 groups, all checks passed\n")


def test_strict_turns_warnings_into_input_errors() -> None:
    argv = ("--config-file", "configs/llama3_8b.yaml", "--training.max_steps", "10", "--dry-run", "--strict")
    status, out, err = launch(*argv)
    assert (status, out) == (2, "")
    assert err.splitlines() == [WARMUP.replace(" warning:", ""), "1 problem found; nothing was started."]


def test_under_torchrun_only_rank_zero_prints_warnings_and_the_summary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "1")
    assert launch("--config-file", "configs/llama3_8b.yaml", "--training.max_steps", "10", "--dry-run") == (
        0,
        "",
        "",
    )


def test_python_api_names_the_override_that_set_the_other_value() -> None:
    cfg = load_config("configs/qwen3_5_full.yaml")
    with pytest.raises(ConfigError) as info:
        apply_overrides(cfg, {"training.max_steps": "300"}, strict=True)
    assert report(info.value.issues) == [
        (
            None,
            "validator.freq",
            "validation would never run: freq (500) exceeds training.max_steps "
            "(300, set by overrides['training.max_steps'])",
        )
    ]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        pytest.param(
            ("--training.micro_batch_size", "3"),
            "configs/qwen3_5_full.yaml:65:22: training.global_batch_size: must be a multiple of "
            "micro_batch_size (3, set by --training.micro_batch_size), got 64",
            id="a-sibling-set-by-a-flag",
        ),
        pytest.param(
            ("--lr_scheduler.warmup_steps", "6000"),
            "--lr_scheduler.warmup_steps: must be <= training.max_steps (5000), got 6000",
            id="its-own-flag-is-the-location",
        ),
    ],
)
def test_errors_and_warnings_caused_by_an_override_say_so(argv: tuple[str, ...], line: str) -> None:
    status, _, err = launch("--config-file", "configs/qwen3_5_full.yaml", *argv, "--dry-run", "--strict")
    assert status == 2
    assert err.splitlines()[0] == line


# --- point 5: every problem at once -------------------------------------------------------------------------


def test_an_unknown_root_field_hides_no_name_or_type_and_calls_no_target(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        text(
            "  flavour: 0.8B\n",
            "trainer:\n  max_steps: 10\n",
            f"optimizer:\n  _target_: {ADAMW}\n  lr: fast\n",
            f"training:\n  _target_: {TRAINING}\n  seed: -1\n",
        )
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, {"optimizer.eps": "0"})
    assert report(info.value.issues) == [
        (
            f"{path}:4:3",
            "model.flavour",
            "unknown parameter 'flavour' of create_model_spec(); did you mean 'flavor'?",
        ),
        (f"{path}:5:1", "trainer", "unknown root field 'trainer'; did you mean 'training'?"),
        (f"{path}:9:7", "optimizer.lr", "expected a number, got the string 'fast'"),
    ]
    # training.seed -1 breaks a validator: validators run once the root is clean (no target is called
    # while it is not), and then it is reported with the override's problem.
    path.write_text(path.read_text().replace("trainer:\n  max_steps: 10\n", "").replace("fast", "1.0"))
    with pytest.raises(ConfigError) as info:
        load_config(path, {"optimizer.eps": "0"})
    assert report(info.value.issues) == [
        (
            f"{path}:4:3",
            "model.flavour",
            "unknown parameter 'flavour' of create_model_spec(); did you mean 'flavor'?",
        ),
        (f"{path}:10:9", "training.seed", "must be >= 0, got -1"),
    ]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param(
            "  lr: 2.0e-4\n",
            ("<doc>:7:3", "optimizer.lr", "duplicate key 'lr' (first defined at line 6)"),
            id="duplicate-key",
        ),
        pytest.param(
            "  <<: {eps: 1.0e-6}\n",
            (
                "<doc>:7:3",
                "optimizer",
                "merge keys ('<<') are YAML 1.1 and not supported; write the keys out or alias the whole "
                "mapping",
            ),
            id="merge-key",
        ),
    ],
)
def test_duplicate_and_merge_keys_are_reported_and_checking_goes_on(
    extra: str, expected: tuple[str, str, str]
) -> None:
    doc = text(f"optimizer:\n  _target_: {ADAMW}\n  lr: 1.0e-4\n{extra}  eps: -1.0\n")
    with pytest.raises(ConfigError) as info:
        load_config("<doc>", text=doc)
    assert report(info.value.issues) == [expected, ("<doc>:8:8", "optimizer.eps", "must be > 0.0, got -1.0")]


@pytest.mark.parametrize(
    ("betas", "expected"),
    [
        pytest.param(
            [0.9, 1.5], [("optimizer.betas[1]", "must be < 1.0, got 1.5")], id="value-error-at-its-index"
        ),
        pytest.param(
            ["x", 1.5],
            [
                ("optimizer.betas[0]", "expected a number, got the string 'x'"),
                ("optimizer.betas[1]", "must be < 1.0, got 1.5"),
            ],
            id="a-type-error-hides-no-value-error",
        ),
        pytest.param(
            [1.2, -0.5],
            [
                ("optimizer.betas[0]", "must be < 1.0, got 1.2"),
                ("optimizer.betas[1]", "must be >= 0.0, got -0.5"),
            ],
            id="every-item",
        ),
    ],
)
def test_list_items_are_checked_one_by_one(betas: list[Any], expected: list[tuple[str, str]]) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_root({"model": {"_target_": QWEN}, "optimizer": {"_target_": ADAMW, "betas": betas}})
    assert [(i.path, i.message) for i in info.value.issues] == expected


# --- point 12: messages in the project's words ------------------------------------------------------------


@pytest.mark.parametrize(
    ("group", "fields", "path", "message"),
    [
        pytest.param(
            ADAMW, {"no_decay_names": ["bias", ""]}, "optimizer.no_decay_names[1]", "must not be empty"
        ),
        pytest.param(CHECKPOINT, {"folder": ""}, "checkpoint.folder", "must not be empty"),
        pytest.param(METRICS, {"run_name": ""}, "metrics.run_name", "must not be empty"),
        pytest.param(METRICS, {"log_freq": 0}, "metrics.log_freq", "must be > 0, got 0"),
        pytest.param(ADAMW, {"weight_decay": -0.1}, "optimizer.weight_decay", "must be >= 0.0, got -0.1"),
        pytest.param(
            "hyper_parallel.trainer.config.ParallelismConfig",
            {"tp": 0},
            "parallelism.tp",
            "must be >= 1, or -1 for auto, got 0",
        ),
    ],
)
def test_validator_messages_are_in_the_projects_words(
    group: str, fields: dict[str, Any], path: str, message: str
) -> None:
    name = {ADAMW: "optimizer", CHECKPOINT: "checkpoint", METRICS: "metrics"}.get(group, "parallelism")
    with pytest.raises(ConfigError) as info:
        resolve_root({"model": {"_target_": QWEN}, name: {"_target_": group, **fields}})
    assert [(i.path, i.message) for i in info.value.issues] == [(path, message)]


def test_the_document_root_is_named_in_words(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    status, _, err = launch("--config-file", str(path), "--dry-run")
    assert status == 2
    assert (
        err.splitlines()[0]
        == f"{path}:1:1: top level: expected a mapping of root groups, got a list of 2 items"
    )
    with pytest.raises(ConfigError) as info:
        resolve_root([1])  # type: ignore[arg-type]
    assert str(info.value) == "top level: expected a mapping of root groups, got a list of 1 item"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        pytest.param(
            ("--optimizer.lr", "x"), "--optimizer.lr: expected a number, got the string 'x'", id="flag"
        ),
        pytest.param(
            ("--dryrun",), "--dryrun: unknown option '--dryrun'; did you mean '--dry-run'?", id="option"
        ),
        pytest.param(
            ("--optimizer.lrr", "1"),
            "--optimizer.lrr: no field 'lrr' under 'optimizer'; did you mean 'lr'?",
            id="path",
        ),
    ],
)
def test_command_line_issues_do_not_repeat_their_path(argv: tuple[str, ...], line: str) -> None:
    status, _, err = launch("--config-file", "configs/qwen3_5.yaml", "--dry-run", *argv)
    assert status == 2
    assert err.splitlines()[0] == line


def test_python_api_overrides_are_not_labelled_as_flags() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("configs/qwen3_5.yaml", {"optimizer.lr": "x"})
    (issue,) = info.value.issues
    assert issue == Issue(
        "optimizer.lr", "expected a number, got the string 'x'", "overrides['optimizer.lr']"
    )
    assert str(issue) == "overrides['optimizer.lr']: expected a number, got the string 'x'"


# --- point 14: the dry-run summary --------------------------------------------------------------------------


def summary_lines(*argv: str, config: str = "configs/qwen3_5.yaml") -> dict[str, str]:
    status, out, _ = launch("--config-file", config, "--dry-run", *argv)
    assert status == 0
    lines = out.split("\npreflight:")[0].splitlines()[1:]
    return {line.split()[0]: line.strip().split(None, 1)[1] for line in lines}


@pytest.mark.parametrize(
    ("argv", "group", "shown"),
    [
        pytest.param((), "optimizer", "AdamW.Config: lr=0.0002, weight_decay=0.1", id="set-in-the-file"),
        pytest.param(
            ("--optimizer.lr", "3e-4"),
            "optimizer",
            "AdamW.Config: lr=0.0003, weight_decay=0.1",
            id="flag-equal-to-default",
        ),
        pytest.param(
            ("--training.seed", "42"),
            "training",
            "TrainingConfig: max_steps=100, global_batch_size=8, seed=42",
            id="flag-seed",
        ),
        pytest.param((), "loss", "CausalLMLoss.Config: ignore_index=-100", id="file-value-equal-to-default"),
        pytest.param(
            (
                "--model._target_",
                "hyper_parallel.models.llama3.create_model_spec",
                "--model.flavor",
                "debugmodel",
            ),
            "model",
            "hyper_parallel.models.llama3.create_model_spec(flavor=debugmodel, "
            "weights_path=/path/to/Qwen3.5-0.8B-Base, overrides=null)",
            id="factory-module",
        ),
    ],
)
def test_dry_run_summary_shows_what_was_set(argv: tuple[str, ...], group: str, shown: str) -> None:
    assert summary_lines(*argv)[group] == shown


# --- small wordings: numbers agree with their nouns, counts are integers -----------------------------------


def _rule_messages(**groups: Any) -> list[str]:
    from hyper_parallel.components.metrics import MetricsLogger
    from hyper_parallel.components.tokenizer import ByteTokenizer
    from hyper_parallel.models.qwen3_5 import create_model_spec
    from hyper_parallel.trainer import rules
    from hyper_parallel.trainer.config import TrainerConfig

    groups = {"tokenizer": ByteTokenizer.Config(), "metrics": MetricsLogger.Config(log_freq=1), **groups}
    cfg = TrainerConfig(
        model=create_model_spec(flavor="debugmodel", overrides={"n_layers": 1, "full_attention_interval": 1}),
        **groups,
    )
    return [m for _, m in (*rules.cross_group_issues(cfg), *rules.warnings(cfg))]


def _validation_line(values: dict[str, Any]) -> str:
    from hyper_parallel.components.metrics import MetricsLogger
    from hyper_parallel.components.metrics._runtime import MetricsProcessor

    stream = io.StringIO()
    logger = MetricsProcessor(MetricsLogger.Config(run_name="r"), rank=0, stream=stream)
    logger.log_validation(4, values)
    logger.close()
    return stream.getvalue().strip()


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        pytest.param(lambda: _counted(1, "step"), "1 step", id="one-step"),
        pytest.param(lambda: _counted(0, "step"), "0 steps", id="no-steps"),
        pytest.param(
            lambda: _rule_messages(
                training=_section("TrainingConfig", max_steps=4),
                lr_scheduler=_sched(warmup_steps=3, decay_ratio=0.5),
            ),
            [
                "warmup_steps (3) plus the decay phase (2 steps = decay_ratio x 4) exceeds "
                "training.max_steps (4); the decay is shortened to 1 step"
            ],
            id="decay-of-one-step",
        ),
        pytest.param(
            lambda: _rule_messages(
                activation_checkpoint=_section(
                    "ActivationCheckpointConfig", mode="selective", selective_option=2
                )
            ),
            ["checkpoints every 2nd block but the model has only 1 block, so nothing would be checkpointed"],
            id="one-block",
        ),
        pytest.param(
            lambda: _rule_messages(parallelism=_section("ParallelismConfig", pp=2))[0],
            "must be <= the model's 1 layer, got 2 stages",
            id="one-layer",
        ),
        pytest.param(
            lambda: _validation_line({"loss": 2.0, "perplexity": 7.389, "tokens": 378, "batches": 1}),
            "[r] step      4  validation/loss 2.0000  validation/perplexity 7.3890  validation/tokens 378  "
            "validation/batches 1",
            id="counts-are-integers",
        ),
    ],
)
def test_small_wordings(words: Any, expected: object) -> None:
    assert words() == expected


def _counted(n: int, noun: str) -> str:
    from hyper_parallel._checks import counted

    return counted(n, noun)


def _section(name: str, **fields: Any) -> Any:
    import hyper_parallel.trainer.config as root

    return getattr(root, name)(**fields)


def _sched(**fields: Any) -> Any:
    from hyper_parallel.components.lr_scheduler import WarmupDecay

    return WarmupDecay.Config(**fields)


# --- the file's hints are the command line's ---------------------------------------------------------------

MADE_FROM = "; 'args' is made by the factory from 'overrides': set model.overrides.n_layers"


@pytest.mark.parametrize(
    ("group", "body", "flag", "file_message", "flag_message"),
    [
        pytest.param(
            "training",
            "  lr: 0.1\n",
            "training.lr",
            "unknown field 'lr' for TrainingConfig; it is a field of 'optimizer' (optimizer.lr)",
            "no field 'lr' under 'training'; it is a field of 'optimizer' (optimizer.lr)",
            id="field-of-another-group",
        ),
        pytest.param(
            "training",
            "  warmup_steps: 3\n",
            "training.warmup_steps",
            "unknown field 'warmup_steps' for TrainingConfig; did you mean 'max_steps', or "
            "lr_scheduler.warmup_steps?",
            "no field 'warmup_steps' under 'training'; did you mean 'max_steps', or "
            "lr_scheduler.warmup_steps?",
            id="close-name-and-another-group",
        ),
        pytest.param(
            "model",
            "  args:\n    n_layers: 4\n",
            "model.args.n_layers",
            f"unknown parameter 'args' of create_model_spec(){MADE_FROM}",
            f"no field 'args' under 'model'{MADE_FROM}",
            id="model-args-are-overrides",
        ),
    ],
)
def test_a_file_gets_the_hint_the_command_line_gets(
    tmp_path: Path, group: str, body: str, flag: str, file_message: str, flag_message: str
) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(text(body) if group == "model" else text(f"{group}:\n  _target_: {TRAINING}\n{body}"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    issue_path = "model.args" if group == "model" else flag
    assert [(i.path, i.message) for i in info.value.issues] == [(issue_path, file_message)]
    with pytest.raises(ConfigError) as info:
        load_config_report(REPO / "configs/qwen3_5_debug.yaml", {flag: "1"}, command_line=True)
    assert [(i.location, i.message) for i in info.value.issues] == [(f"--{flag}", flag_message)]
