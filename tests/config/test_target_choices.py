"""Issue 44 point 6: a ``_target_`` that names nothing that exists (and nothing close to it) or another
group's Config class is refused with the targets of that group that exist, as naming a base class is; a
close name still gets its one guess."""

import io
from pathlib import Path

import pytest

from hyper_parallel import launch
from hyper_parallel.config import ConfigError, load_config

C = "hyper_parallel.components"
MODEL = "model:\n  _target_: hyper_parallel.models.qwen3_5.create_model_spec\n  weights_path: /w\n"
OPTIMIZERS = f"; name one of: {C}.optimizer.AdamW.Config, {C}.optimizer.SGD.Config"
SCHEDULERS = f"; name one of: {C}.lr_scheduler.WarmupDecay.Config"
MODELS = (
    "; name one of: hyper_parallel.models.hf.create_model_spec, "
    "hyper_parallel.models.llama3.create_model_spec, "
    "hyper_parallel.models.qwen3_5.create_model_spec, hyper_parallel.models.qwen3_5.create_vl_model_spec, "
    "hyper_parallel.models.qwen3_5_moe.create_model_spec"
)
EXPECTED = "or a factory function declared to return one"
DEBUG = str(Path(__file__).resolve().parents[2] / "configs" / "qwen3_5_debug.yaml")


@pytest.mark.parametrize(
    ("group", "target", "message"),
    [
        (
            "optimizer",
            f"{C}.optimizer.Lion.Config",
            f"module '{C}.optimizer' has no attribute 'Lion'{OPTIMIZERS}",
        ),
        (
            "lr_scheduler",
            f"{C}.lr_scheduler.Cosine.Config",
            f"module '{C}.lr_scheduler' has no attribute 'Cosine'{SCHEDULERS}",
        ),
        (
            "lr_scheduler",
            f"{C}.optimizer.AdamW.Config",
            f"'{C}.optimizer.AdamW.Config' is the class AdamW.Config; expected a Config class deriving from "
            f"LRScheduler.Config, {EXPECTED}{SCHEDULERS}",
        ),
        (  # the closest name is a base, which is no target: the list, not the guess
            "optimizer",
            f"{C}.optimizer.Optimizr.Config",
            f"module '{C}.optimizer' has no attribute 'Optimizr'{OPTIMIZERS}",
        ),
        (  # a close name: its guess, not the list
            "optimizer",
            f"{C}.optimizer.AdamX.Config",
            f"module '{C}.optimizer' has no attribute 'AdamX'; did you mean 'AdamW'?",
        ),
    ],
)
def test_a_wrong_target_in_a_file_lists_the_groups_targets(group: str, target: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("run.yaml", text=f"{MODEL}{group}:\n  _target_: {target}\n")
    assert [(i.location, i.path, i.message) for i in info.value.issues] == [
        ("run.yaml:5:13", f"{group}._target_", message)
    ]


def test_a_model_that_does_not_exist_lists_the_model_factories() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("run.yaml", text="model:\n  _target_: hyper_parallel.models.llama3.deepseek_v3\n")
    assert [(i.location, i.path, i.message) for i in info.value.issues] == [
        (
            "run.yaml:2:13",
            "model._target_",
            f"module 'hyper_parallel.models.llama3' has no attribute 'deepseek_v3'{MODELS}",
        )
    ]


def test_a_wrong_target_in_an_override_lists_the_groups_targets() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(DEBUG, {"optimizer._target_": f"{C}.loss.CausalLMLoss.Config"})
    assert [(i.location, i.path, i.message) for i in info.value.issues] == [
        (
            "overrides['optimizer._target_']",
            "optimizer._target_",
            f"'{C}.loss.CausalLMLoss.Config' is the class CausalLMLoss.Config; expected a Config class "
            f"deriving from Optimizer.Config, {EXPECTED}{OPTIMIZERS}",
        )
    ]


def test_a_wrong_target_flag_lists_the_groups_targets() -> None:
    out, err = io.StringIO(), io.StringIO()
    argv = ["--config-file", DEBUG, "--lr_scheduler._target_", f"{C}.lr_scheduler.Cosine.Config", "--dry-run"]
    assert launch.main(argv, prog="train_lm", out=out, err=err) == launch.EXIT_INPUT_ERROR
    assert err.getvalue().splitlines() == [
        f"--lr_scheduler._target_: module '{C}.lr_scheduler' has no attribute 'Cosine'{SCHEDULERS}",
        "1 problem found; nothing was started.",
    ]


def test_a_close_name_that_is_no_target_is_not_guessed() -> None:
    # 'mixtral' is close to 'Literal', which the model's module imports: not a model, so not said
    with pytest.raises(ConfigError) as info:
        load_config("run.yaml", text="model:\n  _target_: hyper_parallel.models.llama3.mixtral\n")
    assert [(i.location, i.path, i.message) for i in info.value.issues] == [
        (
            "run.yaml:2:13",
            "model._target_",
            f"module 'hyper_parallel.models.llama3' has no attribute 'mixtral'{MODELS}",
        )
    ]
