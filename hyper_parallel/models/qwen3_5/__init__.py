"""Qwen 3.5: the ``create_model_spec`` and ``create_vl_model_spec`` factories named by ``model._target_``.

The factories only pick a flavor's arguments, apply typed overrides and return a ``ModelSpec``; they
never touch the filesystem (``weights_path`` is checked when the weights are loaded). See
``hyper_parallel.models.qwen3_5.args`` for which dimensions are verified.
"""

from typing import Literal

from hyper_parallel.factory_calls import records_call
from hyper_parallel.models._factory import create_spec, overrides_check
from hyper_parallel.models.qwen3_5._runtime import (
    Qwen3_5StateDictAdapter,
    Qwen3_5VLStateDictAdapter,
    build_model,
    build_vl_model,
    init_parameter,
    init_vl_parameter,
    parallelize,
    parallelize_vl,
)
from hyper_parallel.models.qwen3_5.args import (
    QWEN3_5_FLAVORS,
    QWEN3_5_VL_FLAVORS,
    Qwen3_5Args,
    Qwen3_5VisionArgs,
    Qwen3_5VLArgs,
)
from hyper_parallel.models.spec import ModelSpec

__all__ = [
    "QWEN3_5_FLAVORS",
    "QWEN3_5_VL_FLAVORS",
    "Qwen3_5Args",
    "Qwen3_5Flavor",
    "Qwen3_5VLArgs",
    "Qwen3_5VisionArgs",
    "create_model_spec",
    "create_vl_model_spec",
]

#: The flavors of both tables, as a closed choice for the resolver and ``--help``.
Qwen3_5Flavor = Literal["debugmodel", "0.8B", "2B", "4B", "9B", "auto"]


@records_call
def create_model_spec(
    flavor: Qwen3_5Flavor | None = None,
    weights_path: str | None = None,
    overrides: dict[str, int | float | bool | str | None] | None = None,
) -> ModelSpec:
    """Describe a Qwen 3.5 language model of ``flavor``, optionally with ``overrides`` of single arguments.

    Unknown override names, mistyped values and inconsistent dimensions raise ``ValueError``.

    Args:
        flavor: debugmodel, 0.8B, 2B, 4B, 9B, or auto: weights_path's config.json (default if set, else 0.8B).
        weights_path: Safetensors weights folder, or a Hub id org/name[@revision]; null trains from scratch.
        overrides: Single architecture arguments replacing the flavor's (e.g. {n_layers: 4}).
    """
    return create_spec(
        "qwen3_5",
        QWEN3_5_FLAVORS,
        flavor,
        weights_path,
        overrides,
        default="0.8B",
        build_model_fn=build_model,
        parallelize_fn=parallelize,
        state_dict_adapter=Qwen3_5StateDictAdapter,
        init_fn=init_parameter,
    )


@records_call
def create_vl_model_spec(
    flavor: Qwen3_5Flavor | None = None,
    weights_path: str | None = None,
    overrides: dict[str, int | float | bool | str | None] | None = None,
) -> ModelSpec:
    """Describe a Qwen 3.5 vision-language model of ``flavor``.

    ``overrides`` keys are dotted: ``text.n_layers`` or ``vision.depth``. Unknown names, mistyped
    values and inconsistent dimensions raise ``ValueError``.

    Args:
        flavor: debugmodel, 0.8B, 2B, 4B, 9B, or auto: weights_path's config.json (default if set, else 0.8B).
        weights_path: Safetensors weights folder, or a Hub id org/name[@revision]; null trains from scratch.
        overrides: Single architecture arguments replacing the flavor's, e.g. {vision.depth: 2}.
    """
    return create_spec(
        "qwen3_5_vl",
        QWEN3_5_VL_FLAVORS,
        flavor,
        weights_path,
        overrides,
        default="0.8B",
        build_model_fn=build_vl_model,
        parallelize_fn=parallelize_vl,
        state_dict_adapter=Qwen3_5VLStateDictAdapter,
        init_fn=init_vl_parameter,
    )


create_model_spec.check_arguments = overrides_check(QWEN3_5_FLAVORS)  # type: ignore[attr-defined]
create_vl_model_spec.check_arguments = overrides_check(QWEN3_5_VL_FLAVORS)  # type: ignore[attr-defined]
