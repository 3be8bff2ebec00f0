"""Reports a new user meets: a value that is not a value, a nested ``_target_``, a factory that fails, and
the permissions of a written config."""

import inspect
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyper_parallel.config import (
    ConfigError,
    apply_overrides,
    converter,
    load_config,
    resolve_root,
    write_config,
)
from tests.support import rule_targets

REPO = Path(__file__).resolve().parents[2]
FULL = REPO / "configs" / "qwen3_5_full.yaml"
ALLOWED = ("tests.support.rule_targets",)
NESTED = (
    "'_target_' is only allowed at the top of a root group; nested sections are configured by their fields, "
    "and the owning Config decides what they build"
)


def _report(exc: ConfigError) -> list[tuple[str | None, str, str]]:
    return [(i.location, i.path, i.message) for i in exc.issues]


# --- a command-line value that is not a value ---------------------------------------------------------


def test_malformed_command_line_value_is_reported_at_its_flag_with_the_other_problems() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(FULL, {"training.max_steps": "[1,", "optimizer.lr": "x"})
    assert _report(info.value) == [
        ("overrides['optimizer.lr']", "optimizer.lr", "expected a number, got the string 'x'"),
        (
            "overrides['training.max_steps']",
            "training.max_steps",
            "cannot read '[1,': invalid YAML: did not find expected node content (while parsing a flow node) "
            "(column 4)",
        ),
    ]


def test_malformed_value_through_the_python_api_is_reported_at_its_key() -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides(load_config(FULL), {"compile.components": "{a: [1"})
    ((location, path, message),) = _report(info.value)
    assert (location, path) == ("overrides['compile.components']", "compile.components")
    assert message.startswith("cannot read '{a: [1': invalid YAML")


def test_malformed_text_for_a_field_that_takes_text_stays_text() -> None:
    cfg = apply_overrides(load_config(FULL), {"metrics.run_name": "[1,"})
    assert cfg.metrics.run_name == "[1,"  # type: ignore[attr-defined]


# --- '_target_' below a root group, at any depth --------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "tp", "paths"),
    [
        ({"_target_": "os.system"}, Any, ["_target_"]),
        ([{"a": {"_target_": "os.system"}}], Any, ["[0].a._target_"]),
        ({"a": {"b": {"_target_": 1}}, "c": [{"_target_": 2}]}, Any, ["a.b._target_", "c[0]._target_"]),
        ({"a": {"_target_": "os.system"}}, dict[str, Any], ["a._target_"]),
        ({"_target_": "os.system"}, dict[str, Any], ["_target_"]),
        ({"a": [[{"_target_": "x"}]]}, dict[str, list[Any]], ["a[0][0]._target_"]),
    ],
)
def test_nested_target_is_refused_at_any_depth(raw: object, tp: Any, paths: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        converter.structure(raw, tp)
    assert [(i.path, i.message) for i in info.value.issues] == [(p, NESTED) for p in paths]


def test_nested_target_inside_an_any_field_of_a_group_is_refused_at_its_path() -> None:
    raw = {
        "kinds": {
            "_target_": "tests.support.rule_targets.Kinds.Config",
            "extra": {"x": {"_target_": "os.system"}},
        }
    }
    from hyper_parallel.config.options import resolve_options
    from tests.support.rule_converter import CONV

    with pytest.raises(ConfigError) as info, resolve_options(allowed_targets=ALLOWED):
        CONV.structure(raw, rule_targets.KindsRoot)
    assert [(i.path, i.message) for i in info.value.issues] == [("kinds.extra.x._target_", NESTED)]


def test_plain_values_in_any_fields_are_taken_as_they_are() -> None:
    value = {"a": [1, {"b": None}], "target": "_target_"}
    assert converter.structure(value, Any) is value


# --- a factory that fails ------------------------------------------------------------------------------


def _line(fn: Any, offset: int) -> int:
    return inspect.getsourcelines(fn)[1] + offset


def test_factory_raising_is_reported_with_its_exception_and_the_line_that_raised() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_root(
            {"model": {"_target_": "tests.support.rule_targets.crashing_model_spec"}}, allowed_targets=ALLOWED
        )
    line = _line(rule_targets.crashing_model_spec, 2)
    assert [(i.path, i.message) for i in info.value.issues] == [
        (
            "model",
            f"crashing_model_spec() raised RuntimeError: boom (at tests/support/rule_targets.py:{line})",
        )
    ]
    assert "Traceback" not in str(info.value)


def test_factory_calling_exit_is_a_config_error_not_the_end_of_the_process() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_root(
            {"model": {"_target_": "tests.support.rule_targets.exiting_model_spec"}}, allowed_targets=ALLOWED
        )
    line = _line(rule_targets.exiting_model_spec, 2)
    assert [i.message for i in info.value.issues] == [
        f"exiting_model_spec() raised SystemExit: 3 (at tests/support/rule_targets.py:{line})"
    ]


def test_ctrl_c_inside_a_factory_still_interrupts() -> None:
    with pytest.raises(KeyboardInterrupt):
        resolve_root(
            {"model": {"_target_": "tests.support.rule_targets.interrupted_model_spec"}},
            allowed_targets=ALLOWED,
        )


# --- permissions of a written config ---------------------------------------------------------------------


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_config_file_gets_the_permissions_the_umask_gives(
    tmp_path: Path, umask: None, mask: int, mode: int
) -> None:
    os.umask(mask)
    out = tmp_path / "out.yaml"
    write_config(load_config(FULL), out)
    assert stat.S_IMODE(out.stat().st_mode) == mode
    assert load_config(out) == load_config(FULL)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_rewriting_a_config_file_keeps_its_permissions(tmp_path: Path, umask: None) -> None:
    out = tmp_path / "out.yaml"
    out.write_text("")
    out.chmod(0o640)
    os.umask(0o077)
    write_config(load_config(FULL), out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert list(tmp_path.iterdir()) == [out]


# --- text that UTF-8 cannot hold ---------------------------------------------------------------------------

NOT_UTF8 = "'\\udcff' is not valid UTF-8 text (it holds a lone surrogate, as from bytes that are not UTF-8)"


@pytest.mark.parametrize("key", ["metrics.run_name", "tokenizer.path", "checkpoint.folder"])
def test_a_lone_surrogate_from_the_shell_is_refused_at_its_flag(key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(FULL, {key: "\udcff"})
    assert _report(info.value) == [(f"overrides[{key!r}]", key, NOT_UTF8)]


@pytest.mark.parametrize(("raw", "tp"), [("\udcff", str), ({"\udcff": 1}, dict[str, int]), ("\udcff", Path)])
def test_a_lone_surrogate_never_enters_through_the_converter(raw: object, tp: Any) -> None:
    with pytest.raises(ConfigError) as info:
        converter.structure(raw, tp)
    assert [i.message for i in info.value.issues] == [NOT_UTF8]


def test_text_in_any_script_is_taken(tmp_path: Path) -> None:
    cfg = apply_overrides(load_config(FULL), {"metrics.run_name": "実験-é"})
    out = tmp_path / "out.yaml"
    write_config(cfg, out)
    assert load_config(out) == cfg


def test_a_config_built_in_python_with_a_lone_surrogate_is_not_written(tmp_path: Path) -> None:
    import attrs

    cfg = load_config(FULL)
    bad = attrs.evolve(cfg, metrics=attrs.evolve(cfg.metrics, run_name="\udcff"))  # type: ignore[misc]
    out = tmp_path / "out.yaml"
    with pytest.raises(ConfigError) as info:
        write_config(bad, out)
    assert _report(info.value) == [
        (None, "metrics.run_name", f"{NOT_UTF8} and cannot be written to a config file")
    ]
    assert not out.exists()


# --- messages that say what was meant ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        (
            {"defaults": ["optimizer: adamw"]},
            "defaults",
            "unknown root field 'defaults': composing a config from other files (Hydra's defaults list) "
            "is not supported; write every group in this file",
        ),
        (
            {"gc_freq": 5},
            "gc_freq",
            "unknown root field 'gc_freq'; it is a field of 'training' (training.gc_freq)",
        ),
        ({"lr": 0.1}, "lr", "unknown root field 'lr'; it is a field of 'optimizer' (optimizer.lr)"),
        (
            {"optimizer": {"_target_": "hyper_parallel.components.optimizer.AdamW"}},
            "optimizer._target_",
            "'hyper_parallel.components.optimizer.AdamW' is the class AdamW; "
            "did you mean 'hyper_parallel.components.optimizer.AdamW.Config'?",
        ),
        (
            {"optimizer": {"_target_": "hyper_paralel.components.optimizer.AdamW.Config"}},
            "optimizer._target_",
            "'hyper_paralel.components.optimizer.AdamW.Config' is outside the allowed target prefixes "
            "(hyper_parallel.components, hyper_parallel.models, hyper_parallel.trainer); did you mean "
            "'hyper_parallel.components.optimizer.AdamW.Config'? Otherwise, "
            "trusted code can allow more with allowed_targets=, --allow-target or "
            "$HYPER_PARALLEL_ALLOWED_TARGETS",
        ),
    ],
)
def test_a_document_mistake_names_what_was_meant(raw: dict[str, Any], path: str, message: str) -> None:
    model = {
        "_target_": "hyper_parallel.models.qwen3_5.create_model_spec",
        "weights_path": "/path/to/weights",
    }
    document = {"model": model, **raw}
    with pytest.raises(ConfigError) as info:
        resolve_root(document)
    assert [(i.path, i.message) for i in info.value.issues] == [(path, message)]


@pytest.mark.parametrize(
    ("key", "path", "message"),
    [
        (
            "training.lr",
            "training.lr",
            "no field 'lr' under 'training'; it is a field of 'optimizer' (optimizer.lr)",
        ),
        (
            "gc_freq",
            "gc_freq",
            "unknown root field 'gc_freq'; it is a field of 'training' (training.gc_freq)",
        ),
        ("flavor", "flavor", "unknown root field 'flavor'; it is a field of 'model' (model.flavor)"),
    ],
)
def test_a_field_given_in_the_wrong_group_names_the_group_that_has_it(
    key: str, path: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(FULL, {key: "5"})
    assert _report(info.value) == [(f"overrides[{key!r}]", path, message)]


def test_a_quoted_number_in_a_file_says_to_remove_the_quotes(tmp_path: Path) -> None:
    text = FULL.read_text(encoding="utf-8").replace("lr: 2.0e-4", 'lr: "3e-4"')
    assert 'lr: "3e-4"' in text
    path = tmp_path / "quoted.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    ((location, field, message),) = _report(info.value)
    assert (location, field) == (f"{path}:38:7", "optimizer.lr")
    assert message.startswith(
        "expected a number, got the string '3e-4' (a number in quotes is text: remove the quotes"
    )


# --- the config checker's command line ------------------------------------------------------------------


def _check(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "hyper_parallel.config", "check", *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.multiprocess
def test_check_reads_standard_input_for_a_dash() -> None:
    code, out, _ = _check("-", stdin=FULL.read_text(encoding="utf-8"))
    assert (code, out.splitlines()[0]) == (0, "<stdin>: ok")
    assert out.splitlines()[1].startswith("preflight: qwen3_5 0.8B")
    code, out, _ = _check("-", stdin="model: 3\n")
    assert (code, out) == (
        1,
        "<stdin>:1:8: model: expected a mapping with '_target_', got the integer 3\n1 of 1 file failed\n",
    )


@pytest.mark.multiprocess
def test_check_takes_the_world_size() -> None:
    code, out, _ = _check("--world-size", "3", "configs/qwen3_5_full.yaml")
    assert code == 1
    assert "which does not divide the world size 3" in out
    assert _check("--world-size=2", "configs/qwen3_5_full.yaml")[0] == 0


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--bogus", "configs/qwen3_5_full.yaml"], "error: unknown option '--bogus'"),
        (["--world-size"], "error: --world-size needs a value"),
        (
            ["--world-size", "0", "configs/qwen3_5_full.yaml"],
            "error: --world-size must be a positive integer, got '0'",
        ),
        (["--allow-target"], "error: --allow-target needs a value"),
        ([], "error: no FILE given"),
    ],
)
def test_check_never_reads_an_option_as_a_file(args: list[str], error: str) -> None:
    code, out, err = _check(*args)
    assert (code, out, err.splitlines()[0]) == (2, "", error)


@pytest.mark.multiprocess
@pytest.mark.parametrize("prefix", ["*", "", ".", ".hyper_parallel", "a-b"])
def test_an_allowed_target_prefix_must_be_a_module_name(prefix: str) -> None:
    # a bad option: exit 2 before any file is read, like the other option errors
    code, out, err = _check(f"--allow-target={prefix}", "configs/qwen3_5_full.yaml")
    assert (code, out) == (2, "")
    assert err.splitlines()[0] == (
        f"error: an allowed target prefix (--allow-target, allowed_targets=) {prefix!r} "
        "is not a dotted module name such as 'my_project.models'"
    )
    with pytest.raises(ConfigError):
        resolve_root({}, allowed_targets=[prefix])


POINTLESS = """\
model:
  _target_: hyper_parallel.models.llama3.create_model_spec
  flavor: debugmodel
  weights_path: /w
training:
  _target_: hyper_parallel.trainer.config.TrainingConfig
  max_steps: 5
"""
POINTLESS_ISSUES = [
    "<stdin>:1:1: {}lr_scheduler.warmup_steps: must be <= training.max_steps (5), got 10",
    "<stdin>:1:1: {}metrics.log_freq: no metrics would be logged: log_freq (10) exceeds "
    "training.max_steps (5)",
]


@pytest.mark.multiprocess
def test_check_prints_warnings_and_passes_unless_strict() -> None:
    code, out, _ = _check("-", stdin=POINTLESS)
    assert code == 0
    assert out.splitlines()[:3] == [*(line.format("warning: ") for line in POINTLESS_ISSUES), "<stdin>: ok"]
    code, out, _ = _check("--strict", "-", stdin=POINTLESS)
    assert (code, out.splitlines()) == (
        1,
        [*(line.format("") for line in POINTLESS_ISSUES), "1 of 1 file failed"],
    )
