"""Dumps: every group with its ``_target_``, every field explicit, and a reload that gives an equal config."""

from pathlib import Path

import attrs
import pytest
import yaml

from hyper_parallel.config import ConfigError, apply_overrides, dump_config, load_config, resolve_root
from hyper_parallel.config.yaml_load import parse_yaml
from hyper_parallel.trainer.config import TrainerConfig

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_dumps_and_reloads_equal(path: Path) -> None:
    cfg = load_config(path)
    text = dump_config(cfg)
    assert resolve_root(yaml.safe_load(text)) == cfg  # PyYAML's own YAML 1.1 reading
    assert resolve_root(parse_yaml(text)[0]) == cfg  # our YAML 1.2 reading


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_dump_is_explicit_in_declaration_order(path: Path) -> None:
    cfg = load_config(path)
    tree = yaml.safe_load(dump_config(cfg))
    assert list(tree) == [f.name for f in attrs.fields(TrainerConfig)]
    for f in attrs.fields(TrainerConfig):
        group = tree[f.name]
        assert "_target_" in group
        value = getattr(cfg, f.name)
        if f.name != "model":
            assert list(group)[1:] == [a.name for a in attrs.fields(type(value))]


HAND_BUILT = (
    "this ModelSpec was built without a factory (ModelSpec(...) or attrs.evolve), so it cannot be "
    "written to a config file or made again with overrides: a file cannot hold its build_model_fn, "
    "parallelize_fn, state_dict_adapter and init_fn (Python objects); make it with a factory "
    "declared to return ModelSpec (a config names it in '_target_'; called in Python, a factory "
    "decorated with hyper_parallel.factory_calls.records_call records the call)"
)


def test_factory_group_dumps_as_its_call_with_every_argument() -> None:
    cfg = load_config(CONFIGS[0].parent / "qwen3_5.yaml")
    tree = yaml.safe_load(dump_config(cfg))
    assert tree["model"] == {
        "_target_": "hyper_parallel.models.qwen3_5.create_model_spec",
        "flavor": None,  # auto where weights_path is given, as the factory's default says
        "weights_path": "/path/to/Qwen3.5-0.8B-Base",
        "overrides": None,
    }


def test_dump_after_switching_target_reloads_equal() -> None:
    cfg = load_config(CONFIGS[0].parent / "qwen3_5.yaml")
    new = apply_overrides(
        cfg,
        {
            "optimizer._target_": "hyper_parallel.components.optimizer.SGD.Config",
            "optimizer.momentum": "0.9",
            "model.overrides": "{n_layers: 4}",
        },
    )
    assert resolve_root(yaml.safe_load(dump_config(new))) == new


def test_a_value_that_cannot_be_named_is_an_error_at_dump_time() -> None:
    cfg = load_config(CONFIGS[0].parent / "qwen3_5.yaml")

    @attrs.frozen(kw_only=True)
    class Local(type(cfg.optimizer)):  # type: ignore[misc]
        pass

    broken = attrs.evolve(cfg, optimizer=Local(lr=0.1))
    with pytest.raises(ConfigError) as info:
        dump_config(broken)
    (issue,) = info.value.issues
    assert issue.path == "optimizer"
    assert "cannot be named as a '_target_'" in issue.message
    assert "a lambda or a local definition" in issue.message


def test_a_model_spec_not_built_by_a_factory_cannot_be_dumped() -> None:
    cfg = load_config(CONFIGS[0].parent / "qwen3_5.yaml")
    copy = attrs.evolve(cfg.model)  # same fields, but no record of the factory call
    with pytest.raises(ConfigError) as info:
        dump_config(attrs.evolve(cfg, model=copy))
    assert [(i.path, i.message) for i in info.value.issues] == [("model", HAND_BUILT)]
