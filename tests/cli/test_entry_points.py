"""The real entry points, run as subprocesses: exit codes, stdout and stderr as a user sees them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from hyper_parallel.config import load_config, resolve_root

pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
MINIMAL = "configs/qwen3_5.yaml"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    if "--dry-run" in args:  # the shipped configs name placeholder files: check the config alone
        args = (*args, "--no-file-checks")
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **(env or {})},
    )


def test_dry_run_resolves_and_prints_a_summary() -> None:
    done = run(
        "hyper_parallel.train_lm",
        "--config-file",
        MINIMAL,
        "--dry-run",
        "--training.max_steps",
        "200",
        "--parallelism.tp=2",
        "--optimizer.lr",
        "0.0001",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"resolved {MINIMAL}: 17 groups, all checks passed\n")
    assert "  optimizer              AdamW.Config: lr=0.0001" in done.stdout
    assert "  training               TrainingConfig: max_steps=200" in done.stdout
    assert done.stderr == ""


def test_input_errors_go_to_stderr_one_per_line_with_exit_2() -> None:
    done = run(
        "hyper_parallel.train_lm",
        "--config-file",
        MINIMAL,
        "--dry-run",
        "--training.max_steps",
        "2e2",
        "--optimizer.lrr",
        "1",
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "--optimizer.lrr: no field 'lrr' under 'optimizer'; did you mean 'lr'?",
        "--training.max_steps: expected an integer, got the number 200.0",
        "2 problems found; nothing was started.",
    ]
    assert "Traceback" not in done.stderr


def test_file_errors_carry_file_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / MINIMAL).read_text().replace("lr: 0.0002", "lr: -0.1"))
    done = run("hyper_parallel.train_lm", "--config-file", str(bad), "--dry-run")
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == f"{bad}:16:7: optimizer.lr: must be > 0.0, got -0.1"


def test_only_rank_zero_prints_but_every_rank_exits_2() -> None:
    args = ("hyper_parallel.train_lm", "--config-file", MINIMAL, "--dry-run", "--optimizer.lr", "x")
    rank1 = run(*args, env={"RANK": "1", "WORLD_SIZE": "2"})
    rank0 = run(*args, env={"RANK": "0", "WORLD_SIZE": "2"})
    assert (rank1.returncode, rank1.stderr, rank1.stdout) == (2, "", "")
    assert rank0.returncode == 2
    assert "optimizer.lr: expected a number" in rank0.stderr


@pytest.mark.parametrize(
    ("extra", "env", "line"),
    [
        (
            ["--world-size", "6"],
            None,
            "training.global_batch_size: must be a multiple of micro_batch_size x dp_replicate x dp_shard",
        ),
        ([], {"WORLD_SIZE": "3"}, "parallelism.dp_shard:"),
        (
            ["--world-size", "zero"],
            None,
            "--world-size: world size must be a positive integer, got 'zero'",
        ),
    ],
)
def test_topology_must_fit_the_world_size(extra: list[str], env: dict[str, str] | None, line: str) -> None:
    done = run("hyper_parallel.train_lm", "--config-file", MINIMAL, "--dry-run", *extra, env=env)
    assert done.returncode == 2
    assert line in done.stderr


def test_world_size_that_fits_passes() -> None:
    done = run("hyper_parallel.train_lm", "--config-file", MINIMAL, "--dry-run", "--world-size", "8")
    assert done.returncode == 0, done.stderr
    assert "(world size 8)" in done.stdout.splitlines()[0]


def test_print_config_reloads_to_an_equal_config() -> None:
    done = run(
        "hyper_parallel.train_lm", "--config-file", MINIMAL, "--print-config", "--training.max_steps", "300"
    )
    assert done.returncode == 0, done.stderr
    cfg = resolve_root(yaml.safe_load(done.stdout))
    assert cfg.training.max_steps == 300
    assert cfg == load_config(ROOT / MINIMAL, {"training.max_steps": "300"})


def test_dump_config_writes_atomically_and_never_over_the_input(tmp_path: Path) -> None:
    out = tmp_path / "resolved.yaml"
    done = run("hyper_parallel.train_lm", "--config-file", MINIMAL, "--dump-config", str(out), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert load_config(out) == load_config(ROOT / MINIMAL)
    assert [p.name for p in tmp_path.iterdir()] == ["resolved.yaml"]  # no temporary file left behind
    copy = tmp_path / "in.yaml"
    copy.write_text((ROOT / MINIMAL).read_text())
    before = copy.read_text()
    done = run("hyper_parallel.train_lm", "--config-file", str(copy), "--dump-config", str(copy))
    assert done.returncode == 2
    assert "--dump-config: refusing to overwrite the config file it was given" in done.stderr
    assert copy.read_text() == before


def test_training_refuses_files_that_do_not_exist_before_building_anything() -> None:
    done = run("hyper_parallel.train_lm", "--config-file", MINIMAL, "--parallelism.tp", "1")
    assert done.returncode == 2
    assert (
        f"{MINIMAL}:3:17: model.weights_path: '/path/to/Qwen3.5-0.8B-Base' is not a directory on this machine"
        in done.stderr
    )
    assert "nothing was started" in done.stderr


def test_help_without_a_config_prints_usage() -> None:
    done = run("hyper_parallel.train_lm", "--help")
    assert done.returncode == 0
    assert done.stdout.startswith("usage: python -m hyper_parallel.train_lm --config-file FILE")


def test_help_with_a_config_lists_every_field_with_type_value_and_help() -> None:
    done = run("hyper_parallel.train_lm", "--config-file", MINIMAL, "--help", "--optimizer.lr", "0.001")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    i = lines.index("  --optimizer.lr  (float; current: 0.001)")
    assert lines[i + 1].strip().startswith("Peak learning rate")
    assert "  --model.weights_path  (str | null; current: /path/to/Qwen3.5-0.8B-Base)" in lines
    assert "  --optimizer._target_  (str; current: hyper_parallel.components.optimizer.AdamW.Config)" in lines


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--dryrun"],
            "--dryrun: unknown option '--dryrun'; did you mean '--dry-run'?",
        ),
        (["--optimizer.lr"], "--optimizer.lr: --optimizer.lr needs a value"),
        (["stray"], "command line: unexpected argument 'stray'; options start with '--'"),
    ],
)
def test_bad_command_lines(argv: list[str], message: str) -> None:
    done = run("hyper_parallel.train_lm", "--config-file", MINIMAL, *argv)
    assert done.returncode == 2
    assert message in done.stderr.splitlines()


def test_train_vl_resolves_the_shipped_vl_config() -> None:
    done = run("hyper_parallel.train_vl", "--config-file", "configs/qwen3_5_vl.yaml", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "create_vl_model_spec(" in done.stdout


def test_check_reports_every_issue_of_every_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  _target_: hyper_parallel.models.qwen3_5.create_model_spec\n  flavr: 2B\n")
    done = run("hyper_parallel.config", "check", MINIMAL, str(bad))
    assert done.returncode == 1
    # each file that resolves is followed by its preflight report (tests/preflight/test_report.py)
    assert [line for line in done.stdout.splitlines() if not line.startswith(("preflight:", "  "))] == [
        f"{MINIMAL}: ok",
        f"{bad}:3:3: model.flavr: unknown parameter 'flavr' of create_model_spec(); did you mean 'flavor'?",
        "1 of 2 files failed",
    ]
    assert run("hyper_parallel.config", "check", *map(str, CONFIGS)).returncode == 0


def test_schema_validates_every_shipped_config() -> None:
    done = run("hyper_parallel.config", "schema")
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for path in CONFIGS:
        from hyper_parallel.config.yaml_load import parse_yaml

        raw = parse_yaml(path.read_text())[0]
        assert list(validator.iter_errors(raw)) == [], path
    optimizer = schema["properties"]["optimizer"]["properties"]["_target_"]["enum"]
    assert "hyper_parallel.components.optimizer.SGD.Config" in optimizer
    bad = {
        "model": {"_target_": "hyper_parallel.models.qwen3_5.create_model_spec"},
        "optimizer": {"_target_": "hyper_parallel.components.optimizer.AdamW.Config", "lr": "1e-4"},
    }
    assert list(validator.iter_errors(bad))


def test_train_vl_refuses_a_text_only_model() -> None:
    done = run("hyper_parallel.train_vl", "--config-file", MINIMAL, "--dry-run")
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == (
        f"{MINIMAL}:2:3: model: train_vl needs a vision-language model, but 'qwen3_5' has no vision tower; "
        "use a VL factory such as hyper_parallel.models.qwen3_5.create_vl_model_spec, or train_lm"
    )
