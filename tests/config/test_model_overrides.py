"""What a user sees of a model factory's ``overrides``: the hint from ``model.args``, the ``--help`` lines of
every override key, the banner naming what was overridden, and the exact parameter counts."""

from pathlib import Path

import pytest

from hyper_parallel.config import resolve_root
from hyper_parallel.config.help import config_help
from hyper_parallel.preflight.report import exact_count

QWEN = "hyper_parallel.models.qwen3_5.create_model_spec"
BYTES = {"_target_": "hyper_parallel.components.tokenizer.ByteTokenizer.Config"}
ROOT = Path(__file__).resolve().parents[2]


def resolved(**overrides: object) -> object:
    model = {"_target_": QWEN, "flavor": "debugmodel", "overrides": overrides or None}
    return resolve_root({"model": model, "tokenizer": BYTES})


def test_the_title_names_the_flavor_and_each_overridden_argument() -> None:
    assert resolved(n_layers=6, ffn_hidden_dim=768).model.title() == (  # type: ignore[attr-defined]
        "qwen3_5 debugmodel + n_layers=6, ffn_hidden_dim=768"
    )
    assert resolved().model.title() == "qwen3_5 debugmodel"  # type: ignore[attr-defined]


def test_help_lists_every_override_key_with_its_type_and_the_flavor_default() -> None:
    lines = config_help(resolved(n_layers=6)).splitlines()
    at = lines.index("  --model.overrides.dim  (int; current: 256)")
    assert lines[at + 1] == "      Hidden size of the residual stream."
    assert lines[at + 2] == "  --model.overrides.n_layers  (int; current: 6, default: 4)"
    assert lines[at + 3] == "      Number of transformer blocks."
    assert "  --model.overrides.partial_rotary_factor  (float; current: 0.25)" in lines


def test_exact_counts_stand_beside_the_rounded_ones() -> None:
    assert exact_count(8_030_261_248) == "8.03 B (8,030,261,248)"
    assert exact_count(266_240) == "266.24 K (266,240)"
    assert exact_count(999) == "999"


# -- RFC 5.1 and 5.4: configs and specs built in Python ---------------------------------------------------


def test_a_config_built_in_python_with_a_public_factory_dumps_and_reloads_equal() -> None:
    from hyper_parallel.components.tokenizer import ByteTokenizer
    from hyper_parallel.config import dump_config, load_config
    from hyper_parallel.models.llama3 import create_model_spec as llama3
    from hyper_parallel.models.qwen3_5 import create_model_spec, create_vl_model_spec
    from hyper_parallel.trainer.config import TrainerConfig

    for spec in (
        create_model_spec(flavor="debugmodel", overrides={"n_layers": 8}),
        create_vl_model_spec("debugmodel"),
        llama3(flavor="debugmodel"),
    ):
        cfg = TrainerConfig(model=spec, tokenizer=ByteTokenizer.Config())
        text = dump_config(cfg)
        assert load_config("<string>", text=text) == cfg
        assert dump_config(load_config("<string>", text=text)) == text
    assert text.startswith(
        "model:\n  _target_: hyper_parallel.models.llama3.create_model_spec\n  flavor: debugmodel\n"
        "  weights_path: null\n  overrides: null\n"
    )


def test_the_rfc_model_spec_snippet_runs_as_written_and_names_what_cannot_be_dumped() -> None:
    from hyper_parallel.components.tokenizer import ByteTokenizer
    from hyper_parallel.config import ConfigError, dump_config
    from hyper_parallel.models import ModelSpec
    from hyper_parallel.models.qwen3_5._runtime import Qwen3_5StateDictAdapter, build_model, parallelize
    from hyper_parallel.trainer.config import TrainerConfig

    spec = ModelSpec(
        name="qwen3_5",
        build_model_fn=build_model,
        parallelize_fn=parallelize,
        state_dict_adapter=Qwen3_5StateDictAdapter,
    )
    assert (spec.name, spec.flavor, spec.title()) == ("qwen3_5", "custom", "qwen3_5 custom")
    with pytest.raises(ConfigError) as info:
        dump_config(TrainerConfig(model=spec, tokenizer=ByteTokenizer.Config()))
    assert [(i.path, i.message) for i in info.value.issues] == [
        (
            "model",
            "this ModelSpec was built without a factory (ModelSpec(...) or attrs.evolve), so it cannot be "
            "written to a config file or made again with overrides: a file cannot hold its build_model_fn, "
            "parallelize_fn and state_dict_adapter (Python objects); make it with a factory declared to "
            "return ModelSpec (a config names it in '_target_'; called in Python, a factory decorated "
            "with hyper_parallel.factory_calls.records_call records the call)",
        )
    ]
