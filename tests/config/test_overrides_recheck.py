"""Overrides re-check everything: the whole config is written out, patched and restructured through the
root's hook, so every group's types, validators, target allowlist and the cross-group rules run again."""

from pathlib import Path
from typing import Any

import attrs
import pytest

import hyper_parallel.models.qwen3_5 as qwen3_5
from hyper_parallel.config import ConfigError, apply_overrides, load_config, load_config_report
from hyper_parallel.config.recipes import recipe_of
from hyper_parallel.trainer.config import TrainerConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MINIMAL = CONFIGS / "qwen3_5.yaml"
FULL = CONFIGS / "qwen3_5_full.yaml"
GROUPS = [f.name for f in attrs.fields(TrainerConfig)]


@pytest.fixture(scope="module")
def cfg() -> TrainerConfig:
    return load_config(MINIMAL)


@pytest.fixture(scope="module")
def full() -> TrainerConfig:
    return load_config(FULL)


@pytest.fixture
def factory_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every call the resolver makes of the Qwen 3.5 factory (its body builds the spec with create_spec)."""
    calls: list[tuple[Any, ...]] = []
    real = qwen3_5.create_spec

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(qwen3_5, "create_spec", counting)
    return calls


def _issues(excinfo: pytest.ExceptionInfo[ConfigError]) -> list[tuple[str | None, str, str]]:
    return [(i.location, i.path, str(i.message)) for i in excinfo.value.issues]


def test_every_group_is_built_again_and_equal(cfg: TrainerConfig) -> None:
    new = apply_overrides(cfg, {"optimizer.lr": "1e-4"})
    assert new.optimizer.lr == 1e-4
    assert [g for g in GROUPS if getattr(new, g) != getattr(cfg, g)] == ["optimizer"]
    assert [g for g in GROUPS if getattr(new, g) is getattr(cfg, g)] == []


def test_a_group_no_override_names_is_checked_again() -> None:
    tampered = apply_overrides(load_config_report(MINIMAL), {"training.max_steps": "100"})
    object.__setattr__(tampered.config.training, "max_steps", -5)  # behind the validator's back
    with pytest.raises(ConfigError) as info:
        apply_overrides(tampered, {"optimizer.lr": "1e-4"})
    where = "overrides['training.max_steps']"  # where the value was last set
    assert _issues(info) == [(where, "training.max_steps", "must be > 0, got -5")]


def test_the_target_allowlist_is_applied_again_to_groups_no_override_names(tmp_path: Path) -> None:
    recorder = "tests.support.import_recorder.RecorderOptimizerConfig"
    path = tmp_path / "run.yaml"
    path.write_text(MINIMAL.read_text().replace("hyper_parallel.components.optimizer.AdamW.Config", recorder))
    report = load_config_report(path, allowed_targets=["tests"])
    with pytest.raises(ConfigError) as info:
        apply_overrides(report, {"training.seed": "3"})
    ((location, at, message),) = _issues(info)
    assert (location, at) == (f"{path}:15:3", "optimizer._target_")
    assert message.startswith(f"{recorder!r} is outside the allowed target prefixes (")
    allowed = apply_overrides(report, {"training.seed": "3"}, allowed_targets=["tests"])
    assert allowed.config.training.seed == 3


def test_the_same_values_without_the_record_read_alike(cfg: TrainerConfig) -> None:
    import attrs as attrs_

    bare = attrs_.evolve(cfg)  # no record of what the user set: every check is the same
    for overrides in ({"optimizer.lr": "1e-4"}, {"training.max_steps": "0"}):
        outcomes = []
        for base in (cfg, bare):
            try:
                outcomes.append(apply_overrides(base, overrides))
            except ConfigError as exc:
                outcomes.append([(i.path, str(i.message)) for i in exc.issues])
        assert outcomes[0] == outcomes[1]


def test_an_equal_value_of_another_type_is_still_checked(cfg: TrainerConfig) -> None:
    assert cfg.parallelism.pp == 1  # True == 1 in Python, but an integer field refuses a boolean
    with pytest.raises(ConfigError) as info:
        apply_overrides(cfg, {"parallelism.pp": True})
    assert _issues(info) == [
        ("overrides['parallelism.pp']", "parallelism.pp", "expected an integer, got the boolean true")
    ]


def test_an_override_that_changes_a_group_runs_its_validators(cfg: TrainerConfig) -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides(cfg, {"training.max_steps": "0", "loss.ignore_index": "-100"})
    assert _issues(info) == [("overrides['training.max_steps']", "training.max_steps", "must be > 0, got 0")]


def test_an_override_that_changes_a_group_runs_the_cross_group_rules(cfg: TrainerConfig) -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides(cfg, {"training.seq_len": "1000000"})
    assert _issues(info) == [
        (
            "overrides['training.seq_len']",
            "training.seq_len",
            "must be <= the model's max_seq_len (262144), got 1000000",
        )
    ]


def test_a_bad_override_beside_an_unchanging_one_is_reported_as_alone(cfg: TrainerConfig) -> None:
    alone = {"training.max_steps": "x"}
    with pytest.raises(ConfigError) as single:
        apply_overrides(cfg, alone)
    with pytest.raises(ConfigError) as beside:
        apply_overrides(cfg, {"loss.ignore_index": "-100", **alone})
    assert (
        _issues(beside)
        == _issues(single)
        == [
            (
                "overrides['training.max_steps']",
                "training.max_steps",
                "expected an integer, got the string 'x'",
            )
        ]
    )


def test_the_factory_is_called_again_with_the_arguments_the_user_set(
    full: TrainerConfig, factory_calls: list[tuple[Any, ...]]
) -> None:
    same = apply_overrides(full, {"optimizer.lr": "1e-4"})
    assert len(factory_calls) == 1
    assert same.model == full.model
    changed = apply_overrides(full, {"model.weights_path": "/new"})
    assert len(factory_calls) == 2
    assert factory_calls[1][2:4] == (full.model.flavor, "/new")  # (name, flavors, flavor, weights_path, ...)
    assert changed.model.weights_path == "/new"


def test_a_factory_result_records_where_the_override_set_its_argument(full: TrainerConfig) -> None:
    same = apply_overrides(full, {"model.flavor": full.model.flavor})
    recipe, before = recipe_of(same.model), recipe_of(full.model)
    assert recipe is not None
    assert before is not None
    assert recipe.given["flavor"] == "overrides['model.flavor']"
    assert before.given["flavor"] == f"{FULL}:6:3"  # the resolved config keeps its own record
    assert dict(recipe.args) == dict(before.args)


def test_a_switch_after_an_override_to_the_same_value_cites_that_override() -> None:
    first = load_config(FULL, {"model.flavor": "0.8B"})
    with pytest.raises(ConfigError) as info:
        apply_overrides(first, {"model._target_": "hyper_parallel.models.llama3.create_model_spec"})
    assert _issues(info) == [
        (
            "overrides['model.flavor']",
            "model.flavor",
            "expected one of 'debugmodel', '1B', '3B', '8B', '70B', '405B', 'auto', got the string '0.8B'",
        )
    ]


def test_a_field_set_to_its_default_by_an_override_counts_as_set(full: TrainerConfig) -> None:
    first = apply_overrides(load_config_report(FULL), {"optimizer.amsgrad": "false"})
    assert first.config.optimizer == full.optimizer
    with pytest.raises(ConfigError) as info:
        apply_overrides(first, {"optimizer._target_": "hyper_parallel.components.optimizer.SGD.Config"})
    assert _issues(info)[-1] == (
        "overrides['optimizer.amsgrad']",
        "optimizer.amsgrad",
        "'amsgrad' was set by overrides['optimizer.amsgrad'], but the new target SGD.Config has no such "
        "field; remove it with {'~optimizer.amsgrad': None}",
    )


def test_a_chain_of_overrides_keeps_every_location() -> None:
    first = apply_overrides(load_config_report(FULL), {"optimizer.amsgrad": "false"})
    second = apply_overrides(first, {"training.seed": "7"})
    third = apply_overrides(second, {"loss.reduction": "sum"})
    with pytest.raises(ConfigError) as info:
        apply_overrides(third, {"optimizer._target_": "hyper_parallel.components.optimizer.SGD.Config"})
    assert [(i.location, i.path) for i in info.value.issues] == [
        (f"{FULL}:40:3", "optimizer.betas"),
        (f"{FULL}:41:3", "optimizer.eps"),
        (f"{FULL}:44:3", "optimizer.implementation"),
        ("overrides['optimizer.amsgrad']", "optimizer.amsgrad"),
    ]


def test_an_overridden_config_does_not_keep_the_one_it_was_made_from(full: TrainerConfig) -> None:
    import gc
    import weakref

    first = apply_overrides(full, {"training.seed": "7"})
    second = apply_overrides(first, {"training.seed": "8"})
    gone = weakref.ref(first)
    del first
    gc.collect()
    assert gone() is None
    assert apply_overrides(second, {"training.seed": "9"}).training.seed == 9
