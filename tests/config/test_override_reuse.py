"""Overrides reuse the first resolve's work: what no override changes is kept; all else is checked."""

from pathlib import Path
from typing import Any

import attrs
import pytest

import hyper_parallel.models.qwen3_5 as qwen3_5
from hyper_parallel.config import ConfigError, apply_overrides, load_config
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


def test_groups_no_override_names_are_the_resolved_objects(cfg: TrainerConfig) -> None:
    new = apply_overrides(cfg, {"optimizer.lr": "1e-4"})
    assert new.optimizer.lr == 1e-4
    assert new.optimizer is not cfg.optimizer
    assert [g for g in GROUPS if getattr(new, g) is not getattr(cfg, g)] == ["optimizer"]


def test_a_group_set_to_the_values_it_holds_is_the_resolved_object(cfg: TrainerConfig) -> None:
    new = apply_overrides(
        cfg, {"loss.ignore_index": "-100", "training.max_steps": "100", "optimizer.lr": "1e-4"}
    )
    assert new.loss is cfg.loss
    assert new.training is cfg.training
    assert new.optimizer is not cfg.optimizer


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


def test_the_factory_is_called_again_only_when_its_arguments_change(
    full: TrainerConfig, factory_calls: list[tuple[Any, ...]]
) -> None:
    same = apply_overrides(full, {"model.flavor": full.model.flavor, "optimizer.lr": "1e-4"})
    assert factory_calls == []
    assert same.model == full.model
    changed = apply_overrides(full, {"model.weights_path": "/new"})
    assert len(factory_calls) == 1
    assert factory_calls[0][2:4] == (full.model.flavor, "/new")  # (name, flavors, flavor, weights_path, ...)
    assert changed.model.weights_path == "/new"


def test_a_reused_factory_result_records_where_the_override_set_its_argument(full: TrainerConfig) -> None:
    same = apply_overrides(full, {"model.flavor": full.model.flavor})
    recipe, before = recipe_of(same.model), recipe_of(full.model)
    assert recipe is not None
    assert before is not None
    assert recipe.given["flavor"] == "overrides['model.flavor']"
    assert before.given["flavor"] == f"{FULL}:6:3"  # the resolved config keeps its own record
    assert dict(recipe.args) == dict(before.args)


def test_a_switch_after_an_unchanging_override_cites_that_override() -> None:
    first = load_config(FULL, {"model.flavor": "0.8B"})
    with pytest.raises(ConfigError) as info:
        apply_overrides(first, {"model._target_": "hyper_parallel.models.llama3.create_model_spec"})
    assert _issues(info) == [
        (
            "overrides['model.flavor']",
            "model.flavor",
            "expected one of 'debugmodel', '8B', '70B', '405B', got the string '0.8B'",
        )
    ]


def test_a_field_set_to_its_default_by_an_override_counts_as_set(full: TrainerConfig) -> None:
    first = apply_overrides(full, {"optimizer.amsgrad": "false"})
    assert first.optimizer is full.optimizer
    with pytest.raises(ConfigError) as info:
        apply_overrides(first, {"optimizer._target_": "hyper_parallel.components.optimizer.SGD.Config"})
    assert _issues(info)[-1] == (
        "overrides['optimizer.amsgrad']",
        "optimizer.amsgrad",
        "'amsgrad' was set by overrides['optimizer.amsgrad'], but the new target SGD.Config has no such "
        "field; remove it with {'~optimizer.amsgrad': None}",
    )


def test_a_chain_of_overrides_keeps_every_location(full: TrainerConfig) -> None:
    first = apply_overrides(full, {"optimizer.amsgrad": "false"})
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


def _outcome(cfg: TrainerConfig, overrides: dict[str, Any]) -> tuple[Any, ...]:
    """What ``apply_overrides`` gives: the config with its record and what it reused, or the issues."""
    from hyper_parallel.config.recipes import given_of

    try:
        result = apply_overrides(cfg, overrides)
    except ConfigError as exc:
        return tuple((i.location, i.path, str(i.message)) for i in exc.issues)
    record = given_of(result)
    assert record is not None
    recipe = recipe_of(result.model)
    reused = [g for g in GROUPS if getattr(result, g) is getattr(cfg, g)]
    return result, dict(record.names), dict(record.origins), record.unrecorded, recipe, reused


@pytest.mark.parametrize(
    "overrides",
    [
        {"model.flavor": "0.8B", "optimizer.lr": "1e-4"},  # a factory's group set to what it holds
        {"model.weights_path": "/new", "training.seed": "7", "training.max_steps": "6000"},
        {"loss.reduction": "mean", "activation_checkpoint.mode": "selective", "tokenizer.path": "null"},
        {"training.max_steps": 5000, "metrics.run_name": "naïve", "optimizer.eps": "1e-8"},
        {"dataloader.num_workers": "${env:HP_TEST_WORKERS}", "parallelism.dp_replicate": "2"},
        {"parallelism.pp": True, "loss.reduction": "mean"},  # equal to what it holds, of another type
        {"training.max_steps": 5000.0},
        {"training.max_steps": "x", "loss.reduction": "mean", "training.seed": "${env:HP_TEST_UNSET}"},
        {"optimizer.lr": "1e-4", "training.no_such_field": "1", "no_such_group.x": "1"},
        {"optimizer.lr": "-1", "training.seed": "7"},  # read, then refused by the group's validator
        {"parallelism.tp": "3", "training.seed": "7"},  # every group sound, the root's own rule refuses
        {"dataloader.shuffle": "false", "optimizer.lr": "1e-4", "comm.backend": "gloo"},
    ],
)
def test_the_one_pass_route_gives_what_the_general_steps_give(
    full: TrainerConfig, overrides: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hyper_parallel.config.overrides import OverridePatch

    monkeypatch.setenv("HP_TEST_WORKERS", "4")  # the value the file gives: the group is taken as it is
    one_pass, build = OverridePatch._user_tree_of_fields, OverridePatch.built
    taken, built = [], []

    def counted(self: OverridePatch, *args: Any) -> Any:
        tree = one_pass(self, *args)
        taken.append(tree is not None)
        return tree

    def building(self: OverridePatch) -> Any:
        result = build(self)
        built.append(result is not None)
        return result

    for cfg in (full, apply_overrides(full, {"metrics.run_name": "naïve", "training.seed": "3"})):
        monkeypatch.setattr(OverridePatch, "_user_tree_of_fields", lambda *args: None)
        monkeypatch.setattr(OverridePatch, "built", build)
        general = _outcome(cfg, overrides)  # the general steps (which also look each field up)
        monkeypatch.setattr(OverridePatch, "_user_tree_of_fields", counted)
        monkeypatch.setattr(OverridePatch, "built", building)
        assert _outcome(cfg, overrides) == general
    # The one pass ran where every override names a known field with a value that can be read; the root
    # was built at once from its tree where it also calls no factory again and nothing is refused.
    known = all("no_such" not in k and "UNSET" not in str(v) for k, v in overrides.items())
    assert taken == [known, known]
    at_once = known and "model.weights_path" not in overrides and not isinstance(general[0], tuple)
    assert built == [at_once, at_once]


def test_a_field_never_overridden_before_takes_the_general_steps(full: TrainerConfig) -> None:
    from hyper_parallel.config.manager import _parse_overrides, converter
    from hyper_parallel.config.overrides import OverridePatch

    converter.override_fields.clear()  # no field was looked up yet: the general steps look it up
    parsed = _parse_overrides({"training.seed": "7"}, False)
    first = OverridePatch(converter, converter.root_facts(TrainerConfig), parsed, ())
    first.patch(first.user_tree(full))
    second = OverridePatch(converter, converter.root_facts(TrainerConfig), parsed, ())
    second.user_tree(full)
    assert (first._patched, second._patched) == (False, True)


# --- a reused factory result is copied as copy.copy copies it ----------------------------------------


@attrs.frozen(slots=False)
class _DictBased:
    x: int = 1


@attrs.frozen
class _Slotted:
    x: int = 1


class _OwnCopy:
    def __init__(self) -> None:
        self.x = 1

    def __copy__(self) -> "_OwnCopy":
        return self  # a class's own protocol is followed, whatever it does


class _OwnReduce:
    def __init__(self) -> None:
        self.x = 1

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (_OwnReduce, ())


@pytest.mark.parametrize(
    ("make", "by_its_dict"),
    [(_DictBased, True), (_Slotted, False), (_OwnCopy, False), (_OwnReduce, False), (dict, False)],
)
def test_a_reused_factory_result_is_copied_as_copy_copy_copies_it(make: Any, by_its_dict: bool) -> None:
    import copy

    from hyper_parallel.config.overrides import _copied_by_its_dict, _copy

    value = make()
    assert _copied_by_its_dict(type(value)) is by_its_dict
    ours, theirs = _copy(value), copy.copy(value)
    assert type(ours) is type(theirs)
    assert (ours is value) == (theirs is value)
    assert getattr(ours, "__dict__", None) == getattr(theirs, "__dict__", None)


def test_the_spec_of_a_group_set_to_what_it_holds_is_a_copy_with_the_overrides_recorded(
    full: TrainerConfig,
) -> None:
    from hyper_parallel.config.overrides import _copied_by_its_dict

    assert _copied_by_its_dict(type(full.model))  # a ModelSpec copies by its dict
    again = apply_overrides(full, {"model.flavor": "0.8B"})
    assert again.model is not full.model
    assert again.model == full.model
    assert vars(again.model).keys() == vars(full.model).keys()
    recipe, before = recipe_of(again.model), recipe_of(full.model)
    assert recipe is not None
    assert before is not None
    assert recipe.given["flavor"] == "overrides['model.flavor']"
    assert before.given["flavor"] == f"{FULL}:6:3"  # the config it was copied from keeps its own
