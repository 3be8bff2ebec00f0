"""Every issue of a file carries FILE:LINE:COL of the offending value (key, for unknown keys)."""

from pathlib import Path

import pytest

from hyper_parallel.config import ConfigError, load_config

TESTS = ("tests.support.fake_targets",)

DOC = """\
model:
  _target_: hyper_parallel.models.qwen3_5.create_model_spec
  weight_path: /x
optimizer:
  _target_: hyper_parallel.components.optimizer.AdamW.Config
  lrr: 0.0002
  betas: [0.9, "x"]
training:
  _target_: hyper_parallel.trainer.config.TrainingConfig
  max_steps: 0
  global_batch_size: 8
parallelism:
  _target_: hyper_parallel.trainer.config.ParallelismConfig
  tp: "2"
loss:
  ignore_index: -100
"""


@pytest.fixture
def bad_file(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(DOC)
    return path


def test_five_mistakes_are_one_error_with_exact_locations_sorted_by_position(bad_file: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(bad_file)
    f = str(bad_file)
    assert [(i.location, i.path, i.message) for i in info.value.issues] == [
        (
            f"{f}:3:3",
            "model.weight_path",
            "unknown parameter 'weight_path' of create_model_spec(); did you mean 'weights_path'?",
        ),
        (f"{f}:6:3", "optimizer.lrr", "unknown field 'lrr' for AdamW.Config; did you mean 'lr'?"),
        (f"{f}:7:16", "optimizer.betas[1]", "expected a number, got the string 'x'"),
        (f"{f}:10:14", "training.max_steps", "must be > 0, got 0"),
        (f"{f}:14:7", "parallelism.tp", "expected an integer, got the string '2'"),
        (
            f"{f}:16:3",
            "loss._target_",
            "missing '_target_': a root group given in the file names the Config "
            "class or factory that builds it",
        ),
    ]
    lines = str(info.value).splitlines()
    assert lines[0] == (
        f"{f}:3:3: model.weight_path: unknown parameter 'weight_path' of create_model_spec(); "
        "did you mean 'weights_path'?"
    )
    assert len(lines) == 6


@pytest.mark.parametrize(
    ("doc", "location", "path", "message"),
    [
        (
            "optimzer:\n  _target_: x.y\n",
            "1:1",
            "optimzer",
            "unknown root field 'optimzer'; did you mean 'optimizer'?",
        ),
        ("- 1\n- 2\n", "1:1", "top level", "expected a mapping of root groups, got a list of 2 items"),
        ("training: 3\n", "1:11", "training", "expected a mapping with '_target_', got the integer 3"),
        (
            "model:\n  _target_: hyper_parallel.models.qwen3_5.nope\n",
            "2:13",
            "model._target_",
            "module 'hyper_parallel.models.qwen3_5' has no attribute 'nope'; name one of: "
            "hyper_parallel.models.hf.create_model_spec, "
            "hyper_parallel.models.llama3.create_model_spec, "
            "hyper_parallel.models.qwen3_5.create_model_spec, "
            "hyper_parallel.models.qwen3_5.create_vl_model_spec, "
            "hyper_parallel.models.qwen3_5_moe.create_model_spec",
        ),
        (
            "training:\n  _target_: hyper_parallel.trainer.config.TrainingConfig\n  seq_len: 1.5\n",
            "3:12",
            "training.seq_len",
            "expected an integer, got the number 1.5",
        ),
    ],
)
def test_single_issue_locations(tmp_path: Path, doc: str, location: str, path: str, message: str) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(doc)
    with pytest.raises(ConfigError) as info:
        load_config(file)
    found = [(i.location, i.path, i.message) for i in info.value.issues]
    assert (f"{file}:{location}", path, message) in found


def test_missing_required_root_group_is_located_at_the_document(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("training:\n  _target_: hyper_parallel.trainer.config.TrainingConfig\n")
    with pytest.raises(ConfigError) as info:
        load_config(file)
    assert [(i.location, i.path, i.message) for i in info.value.issues] == [
        (f"{file}:1:1", "model", "missing required root group 'model'"),
    ]


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.yaml")
    (issue,) = info.value.issues
    assert issue.location == str(tmp_path / "nope.yaml")


def test_a_broken_file_and_bad_overrides_are_reported_together(bad_file: Path) -> None:
    overrides = {
        "training.max_steps": "2e2",
        "optimizer.lrr": "1",
        "optimzer.lr": "1",
        "parallelism.tp": "4",  # sound: not reported
        "lr_scheduler.decay_type": "cosin",  # a group the file omits is typed by its default
        "loss._target_": "os.system",
    }
    with pytest.raises(ConfigError) as info:
        load_config(bad_file, overrides)
    flags = [
        (i.location, i.path, i.message) for i in info.value.issues if i.location.startswith("overrides[")
    ]
    assert flags == [
        (
            "overrides['loss._target_']",
            "loss._target_",
            "'os.system' is outside the allowed target prefixes (hyper_parallel.components, "
            "hyper_parallel.models, hyper_parallel.trainer); trusted code can allow more with "
            "allowed_targets=, --allow-target or $HYPER_PARALLEL_ALLOWED_TARGETS",
        ),
        (
            "overrides['lr_scheduler.decay_type']",
            "lr_scheduler.decay_type",
            "expected one of 'linear', 'cosine', 'constant', got the string 'cosin'; did you mean 'cosine'?",
        ),
        (
            "overrides['optimizer.lrr']",
            "optimizer.lrr",
            "no field 'lrr' under 'optimizer'; did you mean 'lr'?",
        ),
        ("overrides['optimzer.lr']", "optimzer", "unknown root field 'optimzer'; did you mean 'optimizer'?"),
        (
            "overrides['training.max_steps']",
            "training.max_steps",
            "expected an integer, got the number 200.0",
        ),
    ]
    assert len(info.value.issues) == 6 + len(flags)  # the file's own six problems come first


PERCENT = """\
model:
  _target_: hyper_parallel.models.llama3.create_model_spec
  flavor: debugmodel
tokenizer:
  _target_: hyper_parallel.components.tokenizer.ByteTokenizer.Config
optimizer:
  _target_: tests.support.fake_targets.PercentOptimizerConfig
  lr: 50
  weight_decay: x
"""


@pytest.mark.parametrize(
    ("lr", "expected"),
    [
        ("50", []),  # 50 percent is 0.5: its validator (0 < lr <= 1) sees the converted value
        ("150", ["run.yaml:8:7: optimizer.lr: must be <= 1.0, got 1.5"]),
    ],
)
def test_a_converted_value_is_validated_as_converted_beside_another_error_of_its_group(
    lr: str, expected: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("run.yaml", text=PERCENT.replace("lr: 50", f"lr: {lr}"), allowed_targets=TESTS)
    assert str(info.value).splitlines() == [
        *expected,
        "run.yaml:9:17: optimizer.weight_decay: expected a number, got the string 'x'",
    ]
