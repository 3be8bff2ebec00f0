"""``_target_`` switches keep only what the user set; ``~group.field`` removes a value; a config's recipes
travel with it through copy, deepcopy and pickle (issue 12, points 1 and 2)."""

import copy
import io
import pickle
import warnings
from pathlib import Path

import attrs
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyper_parallel.components.optimizer import SGD, AdamW
from hyper_parallel.config import (
    ConfigError,
    apply_overrides,
    dump_config,
    load_config,
    load_config_report,
    resolve_root,
)
from hyper_parallel.config.recipes import recipe_of
from hyper_parallel.config.validation import Problem
from hyper_parallel.launch import main
from hyper_parallel.trainer.config import TrainerConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MINIMAL = CONFIGS / "qwen3_5.yaml"  # sets optimizer lr and weight_decay (0.1, AdamW's default)
FULL = CONFIGS / "qwen3_5_full.yaml"
SGD_TARGET = "hyper_parallel.components.optimizer.SGD.Config"
LLAMA = "hyper_parallel.models.llama3.create_model_spec"

# A run whose optimizer section never sets weight_decay (AdamW's default is 0.1, SGD's 0.0).
LR_ONLY = """\
model:
  _target_: hyper_parallel.models.qwen3_5.create_model_spec
  flavor: debugmodel
  weights_path: /weights
optimizer:
  _target_: hyper_parallel.components.optimizer.AdamW.Config
  lr: 0.001
"""


def issues(info: pytest.ExceptionInfo[ConfigError]) -> list[tuple[str | None, str, str]]:
    return [(i.location, i.path, i.message) for i in info.value.issues]


@pytest.fixture
def lr_only(tmp_path: Path) -> Path:
    path = tmp_path / "lr_only.yaml"
    path.write_text(LR_ONLY, encoding="utf-8")
    return path


# --- point 1: a switch keeps what the user set, and only that ---------------------------------------------


def test_switch_on_the_command_line_gives_unset_fields_the_new_class_default(lr_only: Path) -> None:
    new = load_config(lr_only, {"optimizer._target_": SGD_TARGET})
    assert new.optimizer == SGD.Config(lr=0.001)
    assert new.optimizer.weight_decay == 0.0  # SGD's default, not AdamW's 0.1


def test_switch_in_python_gives_unset_fields_the_new_class_default(lr_only: Path) -> None:
    new = apply_overrides(load_config(lr_only), {"optimizer._target_": SGD_TARGET})
    assert new.optimizer == SGD.Config(lr=0.001)


@pytest.mark.parametrize("how", ["command line", "python"])
def test_switch_keeps_a_value_the_file_set_even_when_it_equals_the_old_default(how: str) -> None:
    overrides = {"optimizer._target_": SGD_TARGET}
    new = (
        load_config(MINIMAL, overrides)
        if how == "command line"
        else apply_overrides(load_config_report(MINIMAL), overrides).config
    )
    assert new.optimizer == SGD.Config(lr=0.0002, weight_decay=0.1)


def test_switch_keeps_what_the_file_set_through_earlier_overrides() -> None:
    once = apply_overrides(load_config_report(MINIMAL), {"training.max_steps": "50"})
    twice = apply_overrides(once, {"optimizer._target_": SGD_TARGET}).config
    assert twice.optimizer == SGD.Config(lr=0.0002, weight_decay=0.1)


def test_the_report_an_override_returns_says_what_was_set_and_where() -> None:
    before = load_config_report(MINIMAL)
    overrides = {
        "optimizer._target_": SGD_TARGET,
        "optimizer.momentum": "0.9",
        "lr_scheduler.warmup_steps": 500,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a report holds its warnings: none is emitted
        report = apply_overrides(before, overrides)
    assert [(i.location, i.path) for i in report.warnings] == [
        ("overrides['lr_scheduler.warmup_steps']", "lr_scheduler.warmup_steps")  # longer than the run
    ]
    assert sorted(p for p in report.given if p[0] == "optimizer") == [
        ("optimizer",),
        ("optimizer", "_target_"),
        ("optimizer", "lr"),
        ("optimizer", "momentum"),
        ("optimizer", "weight_decay"),
    ]
    assert report.locate is not None
    assert report.locate(Problem(("optimizer", "momentum"), "", "key")) == "overrides['optimizer.momentum']"
    assert report.locate(Problem(("optimizer", "lr"), "", "key")) == f"{MINIMAL}:16:3"
    assert before.config.optimizer == load_config(MINIMAL).optimizer  # the report given is left as it was


def test_a_value_an_earlier_override_set_is_reported_at_that_flag() -> None:
    once = apply_overrides(load_config_report(MINIMAL), {"optimizer.eps": "1e-6"})
    with pytest.raises(ConfigError) as info:
        apply_overrides(once, {"optimizer._target_": SGD_TARGET})
    assert issues(info) == [
        (
            "overrides['optimizer.eps']",
            "optimizer.eps",
            "'eps' was set by overrides['optimizer.eps'], but the new target SGD.Config has no such field; "
            "remove it with {'~optimizer.eps': None}",
        )
    ]


def test_switching_model_in_python_keeps_an_explicit_flavor_and_reports_it_in_the_file() -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides(load_config(FULL), {"model._target_": LLAMA})
    ((location, path, message),) = issues(info)
    assert (location, path) == (f"{FULL}:6:3", "model.flavor")  # flavor: "0.8B" is never silently 8B
    flavors = "'debugmodel', '1B', '3B', '8B', '70B', '405B', 'auto'"
    assert message.startswith(f"expected one of {flavors}, got the string '0.8B'")


def test_switching_model_in_python_gives_an_unset_flavor_the_new_default() -> None:
    new = apply_overrides(load_config(MINIMAL), {"model._target_": LLAMA})
    assert (new.model.name, new.model.flavor, new.model.weights_path) == (
        "llama3",
        "auto",  # the default where weights_path is given (its folder is not here: not read yet)
        "/path/to/Qwen3.5-0.8B-Base",
    )


def test_switching_model_after_a_deepcopy_still_knows_the_flavor_was_set() -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides(copy.deepcopy(load_config(FULL)), {"model._target_": LLAMA})
    assert [(i.location, i.path) for i in info.value.issues] == [(f"{FULL}:6:3", "model.flavor")]


def _python_built(**optimizer: object) -> TrainerConfig:
    model = load_config(MINIMAL).model
    return TrainerConfig(model=model, optimizer=AdamW.Config(**optimizer))  # type: ignore[arg-type]


def test_a_config_built_in_python_counts_values_other_than_the_default_as_set() -> None:
    cfg = _python_built(lr=0.01, weight_decay=0.1, betas=(0.8, 0.9))
    with pytest.raises(ConfigError) as info:
        apply_overrides(cfg, {"optimizer._target_": SGD_TARGET})
    assert issues(info) == [
        (
            None,
            "optimizer.betas",
            "'betas' was set to a value other than the default, but the new target SGD.Config has no "
            "such field; remove it with {'~optimizer.betas': None}",
        )
    ]
    new = apply_overrides(cfg, {"optimizer._target_": SGD_TARGET, "~optimizer.betas": None})
    assert new.optimizer == SGD.Config(lr=0.01)  # weight_decay=0.1 equals AdamW's default: not counted as set


def test_removing_the_values_the_new_class_lacks_lets_the_switch_through() -> None:
    new = load_config(
        FULL,
        {
            "optimizer._target_": SGD_TARGET,
            "~optimizer.betas": None,
            "~optimizer.eps": None,
            "~optimizer.implementation": None,
        },
    )
    assert new.optimizer == SGD.Config(lr=0.0002, weight_decay=0.1)


def test_removing_a_value_gives_it_its_default_again() -> None:
    cfg = load_config(FULL)
    assert cfg.optimizer.lr == 0.0002
    new = apply_overrides(
        cfg, {"~optimizer.lr": None, "~model.flavor": None, "~dataloader.dataset.seed": None}
    )
    assert new.optimizer == attrs.evolve(cfg.optimizer, lr=AdamW.Config().lr)
    assert new.model.flavor == "auto"  # the default where weights_path is given
    dataset = new.dataloader.dataset  # type: ignore[attr-defined]
    assert (dataset.seed, cfg.dataloader.dataset.seed) == (attrs.fields(type(dataset)).seed.default, 1234)  # type: ignore[attr-defined]


def test_removing_a_whole_group_gives_it_the_root_default() -> None:
    new = apply_overrides(load_config(FULL), {"~optimizer": None})
    assert new.optimizer == AdamW.Config()


@pytest.mark.parametrize(
    ("key", "value", "path", "message"),
    [
        (
            "~optimizer.eps",
            None,
            "optimizer.eps",
            "'eps' is not set (it has its default), so nothing is removed",
        ),
        (
            "~optimizer.betaz",
            None,
            "optimizer.betaz",
            "no field 'betaz' under 'optimizer'; did you mean 'betas'?",
        ),
        (
            "~optimizer.lr",
            "1",
            "optimizer.lr",
            "a removal ('~optimizer.lr') takes no value, got '1'",
        ),
        (
            "~optimizer._target_",
            None,
            "optimizer._target_",
            "'_target_' cannot be removed; switch with optimizer._target_ NAME, or remove the whole group "
            "with ~optimizer",
        ),
        ("~model", None, "model", "'model' has no default, so it cannot be removed"),
    ],
)
def test_a_removal_that_cannot_be_done_is_reported_at_its_key(
    key: str, value: object, path: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides(load_config(MINIMAL), {key: value})
    assert issues(info) == [(f"overrides[{key!r}]", path, message)]


def test_removal_on_the_launch_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    argv = ["--config-file", str(FULL), "--optimizer._target_", SGD_TARGET, "--dry-run", "--world-size", "8"]
    argv.append("--no-file-checks")  # the shipped config names placeholder files
    assert main(argv, out=out, err=err) == 2
    assert f"{FULL}:40:3: optimizer.betas: 'betas' was set at {FULL}:40:3" in err.getvalue()
    removals = ["--~optimizer.betas", "--~optimizer.eps", "--~optimizer.implementation"]
    out, err = io.StringIO(), io.StringIO()
    assert main([*argv[:4], *removals, *argv[4:]], out=out, err=err) == 0, err.getvalue()
    out, err = io.StringIO(), io.StringIO()
    assert main([*argv, "--~optimizer.lr=1"], out=out, err=err) == 2
    assert (
        "--~optimizer.lr: optimizer.lr: a removal ('~optimizer.lr') takes no value, got '1'" in err.getvalue()
    )


# --- point 2: recipes travel with the value -----------------------------------------------------------------


@pytest.mark.parametrize("duplicate", [copy.copy, copy.deepcopy, lambda c: pickle.loads(pickle.dumps(c))])
def test_a_copied_config_can_be_overridden_and_dumped(duplicate: object) -> None:
    cfg = load_config(FULL)
    twin = duplicate(cfg)  # type: ignore[operator]
    assert twin == cfg
    assert recipe_of(twin.model) == recipe_of(cfg.model)
    assert dump_config(twin) == dump_config(cfg)
    new = apply_overrides(twin, {"optimizer.lr": "0.1"})
    assert new == apply_overrides(cfg, {"optimizer.lr": "0.1"})
    assert resolve_root(yaml.safe_load(dump_config(new))) == new


def test_the_recipe_is_not_part_of_equality_or_of_the_fields() -> None:
    cfg = load_config(FULL)
    bare = attrs.evolve(cfg.model)  # evolve makes a new spec, which its factory call no longer describes
    assert recipe_of(bare) is None
    assert bare == cfg.model
    assert hash(bare) == hash(cfg.model)
    assert "recipe" not in repr(cfg.model)


def test_a_hand_built_model_spec_does_not_block_overrides_of_other_groups() -> None:
    cfg = load_config(MINIMAL)
    hand_built = attrs.evolve(cfg, model=attrs.evolve(cfg.model))
    new = apply_overrides(hand_built, {"optimizer.lr": "0.1", "training.max_steps": "50"})
    assert new.model is hand_built.model
    assert (new.optimizer.lr, new.training.max_steps) == (0.1, 50)
    message = (
        "this ModelSpec was built without a factory (ModelSpec(...) or attrs.evolve), so it cannot be "
        "written to a config file or made again with overrides: a file cannot hold its build_model_fn, "
        "parallelize_fn, state_dict_adapter and init_fn (Python objects); make it with a factory "
        "declared to return ModelSpec (a config names it in '_target_'; called in Python, a factory "
        "decorated with hyper_parallel.factory_calls.records_call records the call)"
    )
    with pytest.raises(ConfigError) as info:
        dump_config(new)
    assert issues(info) == [(None, "model", message)]
    with pytest.raises(ConfigError) as info:
        apply_overrides(hand_built, {"model.weights_path": "/w", "optimizer.lr": "0.1"})
    assert issues(info) == [("overrides['model.weights_path']", "model", message)]


_OVERRIDES = {
    "training.max_steps": st.integers(300, 10**6).map(str),
    "optimizer.lr": st.floats(1e-8, 1.0, allow_nan=False).map(repr),
    "model.weights_path": st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1),
    "model.flavor": st.sampled_from(["debugmodel", "0.8B", "2B"]),
    "optimizer._target_": st.sampled_from([SGD_TARGET, "hyper_parallel.components.optimizer.AdamW.Config"]),
    "~optimizer.betas": st.none(),
    "~optimizer.eps": st.none(),
    "~optimizer.implementation": st.none(),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.dictionaries(st.sampled_from(sorted(_OVERRIDES)), st.none()).flatmap(
        lambda keys: st.fixed_dictionaries({k: _OVERRIDES[k] for k in keys})
    ),
    st.sampled_from(["deepcopy", "pickle"]),
)
def test_copies_dump_like_the_original_after_any_overrides(overrides: dict[str, object], how: str) -> None:
    try:
        cfg = apply_overrides(load_config(FULL), overrides)
    except ConfigError:
        return
    twin = copy.deepcopy(cfg) if how == "deepcopy" else pickle.loads(pickle.dumps(cfg))
    assert dump_config(twin) == dump_config(cfg)
    assert apply_overrides(twin, {"training.seed": "3"}) == apply_overrides(cfg, {"training.seed": "3"})


def test_a_bad_removal_is_reported_with_the_problems_of_a_document_that_does_not_resolve(
    lr_only: Path,
) -> None:
    lr_only.write_text(LR_ONLY.replace("lr: 0.001", "lr: fast"), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(lr_only, {"~optimizer.betaz": None, "~optimizer.lr": "1"})
    assert [(i.location, i.path) for i in info.value.issues] == [
        (f"{lr_only}:7:7", "optimizer.lr"),
        ("overrides['~optimizer.betaz']", "optimizer.betaz"),
        ("overrides['~optimizer.lr']", "optimizer.lr"),
    ]
    assert [i.message for i in info.value.issues][1:] == [
        "no field 'betaz' under 'optimizer'; did you mean 'betas'?",
        "a removal ('~optimizer.lr') takes no value, got '1'",
    ]
