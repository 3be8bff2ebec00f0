"""Typed dotted overrides: unstructure, patch, restructure once; every check runs again."""

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
    conversion,
    dump_config,
    load_config,
    load_config_report,
    resolve_root,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MINIMAL = CONFIGS / "qwen3_5.yaml"
FULL = CONFIGS / "qwen3_5_full.yaml"
SGD_TARGET = "hyper_parallel.components.optimizer.SGD.Config"


@pytest.fixture(scope="module")
def cfg():  # type: ignore[no-untyped-def]
    return load_config(MINIMAL)


def issues(excinfo: pytest.ExceptionInfo[ConfigError]) -> list[tuple[str | None, str, str]]:
    return [(i.location, i.path, i.message) for i in excinfo.value.issues]


def test_overrides_return_a_new_config_and_touch_nothing_else(cfg) -> None:  # type: ignore[no-untyped-def]
    new = apply_overrides(cfg, {"training.max_steps": "200", "optimizer.lr": "1e-4"})
    assert new.training.max_steps == 200
    assert new.optimizer.lr == 1e-4
    assert cfg.training.max_steps == 100  # the input is unchanged
    assert attrs.evolve(new, training=cfg.training, optimizer=cfg.optimizer) == cfg


@pytest.mark.parametrize(
    ("key", "text", "expected"),
    [
        ("metrics.run_name", "2024", "2024"),
        ("metrics.run_name", "null", None),
        ("training.max_steps", "200", 200),
        ("optimizer.lr", "1e-4", 1e-4),
        ("optimizer.lr", "3", 3.0),
        ("debug.deterministic", "true", True),
        ("debug.deterministic", "false", False),
        ("optimizer.betas", "[0.8, 0.9]", (0.8, 0.9)),
        ("optimizer.no_decay_names", "[bias, norm]", ("bias", "norm")),
        ("lr_scheduler.decay_type", "linear", "linear"),
        ("parallelism.dp_shard", "-1", -1),
    ],
)
def test_string_values_are_read_by_the_field_type(cfg, key: str, text: str, expected: object) -> None:  # type: ignore[no-untyped-def]
    new = apply_overrides(cfg, {key: text})
    group, field = key.split(".")
    got = getattr(getattr(new, group), field)
    assert got == expected
    assert type(got) is type(expected)


@pytest.mark.parametrize(
    ("key", "text", "message"),
    [
        ("training.max_steps", "2e2", "expected an integer, got the number 200.0"),
        ("training.max_steps", "true", "expected an integer, got the boolean true"),
        ("training.max_steps", "ten", "expected an integer, got the string 'ten'"),
        ("optimizer.lr", "abc", "expected a number, got the string 'abc'"),
        ("optimizer.lr", "-1", "must be > 0.0, got -1.0"),
        ("debug.deterministic", "yes", "expected a boolean (true or false), got the string 'yes'"),
        ("optimizer.betas", "[0.9]", "expected a list of 2 items, got 1"),
        (
            "lr_scheduler.decay_type",
            "cosin",
            "expected one of 'linear', 'cosine', 'constant', got the string 'cosin'; did you mean 'cosine'?",
        ),
    ],
)
def test_wrong_values_name_the_flag(cfg, key: str, text: str, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        apply_overrides(cfg, {key: text})
    assert issues(info) == [(f"overrides[{key!r}]", key, message)]


@pytest.mark.parametrize(
    ("key", "path", "message"),
    [
        ("optimizer.lrr", "optimizer.lrr", "no field 'lrr' under 'optimizer'; did you mean 'lr'?"),
        ("optimzer.lr", "optimzer", "unknown root field 'optimzer'; did you mean 'optimizer'?"),
        (
            "dataloader.dataset.sorce",
            "dataloader.dataset.sorce",
            "no field 'sorce' under 'dataloader.dataset'; did you mean 'source'?",
        ),
        (
            "model.weight_path",
            "model.weight_path",
            "no field 'weight_path' under 'model'; did you mean 'weights_path'?",
        ),
        ("training", "training", "name a field of 'training', e.g. training.<field>"),
    ],
)
def test_unknown_paths_suggest_the_valid_one(cfg, key: str, path: str, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        apply_overrides(cfg, {key: "1"})
    assert issues(info) == [(f"overrides[{key!r}]", path, message)]


def test_malformed_key_is_an_error(cfg) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=r"malformed override key 'a\.\.b'"):
        apply_overrides(cfg, {"a..b": "1"})


def test_every_bad_override_is_reported_at_once(cfg) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        apply_overrides(
            cfg,
            {"training.max_steps": "2e2", "optimizer.lrr": "1", "optimizer.lr": "x", "parallelism.tp": "0"},
        )
    assert [i.path for i in info.value.issues] == [
        "optimizer.lr",
        "optimizer.lrr",
        "parallelism.tp",
        "training.max_steps",
    ]


def test_cross_field_checks_run_again(cfg) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        apply_overrides(cfg, {"training.max_steps": "5"}, strict=True)
    assert [(i.path, i.message) for i in info.value.issues] == [
        (
            "lr_scheduler.warmup_steps",
            "must be <= training.max_steps (5, set by overrides['training.max_steps']), got 10",
        ),
        (
            "metrics.log_freq",
            "no metrics would be logged: log_freq (10) exceeds training.max_steps "
            "(5, set by overrides['training.max_steps'])",
        ),
    ]


def test_cross_field_error_located_at_the_file_when_loading_with_overrides() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(FULL, {"training.max_steps": "100"}, strict=True)
    first = info.value.issues[0]
    assert first.path == "lr_scheduler.warmup_steps"
    assert first.location == f"{FULL}:49:17"


def test_switching_target_keeps_shared_fields_and_drops_defaults() -> None:
    report = load_config_report(MINIMAL)  # what the file set: weight_decay, though AdamW's default
    assert isinstance(report.config.optimizer, AdamW.Config)
    new = apply_overrides(report, {"optimizer._target_": SGD_TARGET, "optimizer.momentum": "0.9"}).config
    assert new.optimizer == SGD.Config(lr=0.0002, weight_decay=0.1, momentum=0.9)


def test_switching_target_refuses_a_value_the_user_set_in_the_file() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(FULL, {"optimizer._target_": SGD_TARGET})
    found = {i.path: i for i in info.value.issues}
    assert set(found) == {"optimizer.betas", "optimizer.eps", "optimizer.implementation"}
    betas = found["optimizer.betas"]
    assert betas.location == f"{FULL}:40:3"
    assert betas.message == (
        f"'betas' was set at {FULL}:40:3, but the new target SGD.Config has no such field; "
        "remove it with {'~optimizer.betas': None}"
    )


def test_switching_target_refuses_a_value_an_override_set(cfg) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        apply_overrides(cfg, {"optimizer.eps": "1e-6", "optimizer._target_": SGD_TARGET})
    assert issues(info) == [
        (
            "overrides['optimizer.eps']",
            "optimizer.eps",
            "'eps' was set by overrides['optimizer.eps'], but the new target SGD.Config has no such "
            "field; remove it with {'~optimizer.eps': None}",
        ),
    ]


def test_switching_to_a_target_of_the_wrong_kind_is_refused(cfg) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        apply_overrides(cfg, {"optimizer._target_": "hyper_parallel.components.loss.CausalLMLoss.Config"})
    (issue,) = info.value.issues
    assert (issue.location, issue.path) == ("overrides['optimizer._target_']", "optimizer._target_")
    assert "expected a Config class deriving from Optimizer.Config" in issue.message


def test_switching_to_a_target_outside_the_allowlist_is_refused_before_import(cfg) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="outside the allowed target prefixes"):
        apply_overrides(cfg, {"optimizer._target_": "os.system"})


def test_overriding_a_factory_argument_reruns_the_factory(cfg) -> None:  # type: ignore[no-untyped-def]
    new = apply_overrides(cfg, {"model.weights_path": "/new", "model.flavor": "2B"})
    assert new.model.weights_path == "/new"
    assert new.model.flavor == "2B"
    assert new.model.args != cfg.model.args


def test_one_restructure_per_call_whatever_the_number_of_overrides(
    cfg, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    calls = []
    original = conversion.structure_root

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(conversion, "structure_root", counting)
    apply_overrides(
        cfg,
        {
            "training.max_steps": "300",
            "training.seed": "7",
            "optimizer.lr": "1e-3",
            "model.weights_path": "/w",
            "metrics.run_name": "x",
        },
    )
    assert len(calls) == 1


_VALUES = {
    "training.max_steps": st.integers(100, 10**6).map(str),
    "training.seed": st.integers(0, 2**31).map(str),
    "optimizer.lr": st.floats(1e-8, 1.0, allow_nan=False).map(repr),
    "optimizer.weight_decay": st.floats(0.0, 1.0).map(repr),
    "metrics.run_name": st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=20),
    "debug.deterministic": st.sampled_from(["true", "false"]),
    "lr_scheduler.decay_type": st.sampled_from(["linear", "cosine", "constant"]),
    "model.weights_path": st.text(
        st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=30
    ),
    "optimizer._target_": st.sampled_from([SGD_TARGET, "hyper_parallel.components.optimizer.AdamW.Config"]),
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.dictionaries(st.sampled_from(sorted(_VALUES)), st.none(), min_size=1).flatmap(
        lambda keys: st.fixed_dictionaries({k: _VALUES[k] for k in keys})
    )
)
def test_round_trip_after_any_override_set(cfg, overrides: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    try:
        new = apply_overrides(cfg, overrides)
    except ConfigError:
        return
    assert resolve_root(yaml.safe_load(dump_config(new))) == new


def test_overrides_never_change_the_source_config_or_its_dump(cfg) -> None:  # type: ignore[no-untyped-def]
    before = dump_config(cfg)
    apply_overrides(
        cfg,
        {
            "optimizer.betas[0]": "0.5",
            "dataloader.dataset.seed": "5",
            "optimizer.lr": "1e-3",
            "model.overrides": "{n_layers: 8}",
        },
    )
    apply_overrides(cfg, {"optimizer._target_": SGD_TARGET, "optimizer.momentum": "0.5"})
    assert dump_config(cfg) == before
    assert apply_overrides(cfg, {}) == cfg


def test_unstructured_trees_belong_to_the_caller(cfg) -> None:  # type: ignore[no-untyped-def]
    from hyper_parallel.config import converter

    tree = converter.unstructure(cfg)
    tree["optimizer"]["lr"] = 123.0
    tree["optimizer"]["betas"][0] = 0.1
    assert converter.unstructure(cfg)["optimizer"]["lr"] == cfg.optimizer.lr
    assert converter.unstructure(cfg)["optimizer"]["betas"] == list(cfg.optimizer.betas)
    assert resolve_root(yaml.safe_load(dump_config(cfg))) == cfg


def test_a_failed_switch_does_not_leak_changes_into_the_source_config(cfg) -> None:  # type: ignore[no-untyped-def]
    before = dump_config(cfg)
    with pytest.raises(ConfigError):
        apply_overrides(cfg, {"optimizer._target_": "hyper_parallel.nope.X", "optimizer.lr": "0.5"})
    assert dump_config(cfg) == before


LLAMA_FACTORY = "hyper_parallel.models.llama3.create_model_spec"


def test_switching_factory_drops_an_old_default_the_new_factory_cannot_take(cfg) -> None:  # type: ignore[no-untyped-def]
    new = load_config(MINIMAL, {"model._target_": LLAMA_FACTORY})
    assert new.model.name == "llama3"
    # qwen's default flavor was never set by the user: llama's default with a weights_path is auto (its
    # folder is not on this machine: not read yet)
    assert (new.model.flavor, new.model.flavor_unread) == ("auto", True)
    assert new.model.weights_path == cfg.model.weights_path  # set in the file: kept


def test_switching_factory_keeps_a_value_the_user_set_and_reports_it_there() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(FULL, {"model._target_": LLAMA_FACTORY})
    (issue,) = info.value.issues
    assert issue.path == "model.flavor"
    assert issue.location == f"{FULL}:6:11"
    assert issue.message.startswith(
        "expected one of 'debugmodel', '1B', '3B', '8B', '70B', '405B', 'auto', got the string '0.8B'"
    )


def test_a_model_argument_quoted_by_another_cites_the_override_that_set_it() -> None:
    flags = {"model.overrides.n_heads": "8", "model.overrides.n_kv_heads": "3"}
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS / "llama3_debug.yaml", flags)
    assert issues(info) == [
        (
            "overrides['model.overrides.n_kv_heads']",
            "model.overrides.n_kv_heads",
            "must divide n_heads (8, set by overrides['model.overrides.n_heads']), got 3",
        )
    ]


def test_the_citation_is_read_from_the_quote_the_rule_made_not_from_the_text() -> None:
    from hyper_parallel._checks import Quote

    with pytest.raises(ConfigError) as info:
        load_config(FULL, {"training.micro_batch_size": "3"})
    (issue,) = info.value.issues
    assert issue.path == "training.global_batch_size"
    assert issue.message.quotes == (  # type: ignore[attr-defined]
        Quote("training.micro_batch_size", 3, "micro_batch_size", "overrides['training.micro_batch_size']"),
    )


def test_an_override_giving_another_value_than_the_one_quoted_is_not_cited() -> None:
    # pp = -1 is inferred as 2 at the world size: the message shows 2, which the override did not give.
    flags = {"parallelism.dp_shard": "1", "parallelism.pp": "-1", "training.micro_batch_size": "1"}
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS / "llama3_debug.yaml", flags, world_size=2)
    messages = [i.message for i in info.value.issues if i.path == "training.micro_batch_size"]
    assert messages
    assert all("pp (2)" in m and "set by overrides['parallelism.pp']" not in m for m in messages)
