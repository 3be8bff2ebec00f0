"""Qwen 3.5 MoE: the ``create_model_spec`` factory named by ``model._target_``.

The factory only picks a flavor's arguments, applies typed overrides and returns a ``ModelSpec``; see
``hyper_parallel.models.qwen3_5_moe.args`` for the architecture and where its numbers come from.
"""

from typing import Literal

from hyper_parallel.factory_calls import records_call
from hyper_parallel.models._factory import create_spec, overrides_check
from hyper_parallel.models.qwen3_5_moe._runtime import (
    Qwen3_5MoeStateDictAdapter,
    build_model,
    init_parameter,
    parallelize,
)
from hyper_parallel.models.qwen3_5_moe.args import QWEN3_5_MOE_FLAVORS, Qwen3_5MoeArgs
from hyper_parallel.models.spec import ModelSpec

__all__ = ["QWEN3_5_MOE_FLAVORS", "Qwen3_5MoeArgs", "Qwen3_5MoeFlavor", "create_model_spec"]

#: The flavors of the table, as a closed choice for the resolver and ``--help``.
Qwen3_5MoeFlavor = Literal["debugmodel", "35B-A3B", "122B-A10B", "397B-A17B", "auto"]


@records_call
def create_model_spec(
    flavor: Qwen3_5MoeFlavor | None = None,
    weights_path: str | None = None,
    overrides: dict[str, int | float | bool | str | None] | None = None,
) -> ModelSpec:
    """Describe a Qwen 3.5 MoE language model of ``flavor``, optionally with ``overrides`` of arguments.

    Unknown override names, mistyped values and inconsistent dimensions raise ``ValueError``.

    Args:
        flavor: debugmodel, 35B-A3B, 122B-A10B, 397B-A17B, or auto (default if weights_path, else 35B-A3B).
        weights_path: Safetensors weights folder, or a Hub id org/name[@revision]; null trains from scratch.
        overrides: Single architecture arguments replacing the flavor's (e.g. {n_experts: 16}).
    """
    return create_spec(
        "qwen3_5_moe",
        QWEN3_5_MOE_FLAVORS,
        flavor,
        weights_path,
        overrides,
        default="35B-A3B",
        build_model_fn=build_model,
        parallelize_fn=parallelize,
        state_dict_adapter=Qwen3_5MoeStateDictAdapter,
        init_fn=init_parameter,
    )


create_model_spec.check_arguments = overrides_check(QWEN3_5_MOE_FLAVORS)  # type: ignore[attr-defined]
