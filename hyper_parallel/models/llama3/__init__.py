"""Llama 3 / 3.1: the ``create_model_spec`` factory named by ``model._target_``.

The factory only picks a flavor's arguments, applies typed overrides and returns a ``ModelSpec``; it
never touches the filesystem (``weights_path`` is checked when the weights are loaded).
"""

from typing import Literal

from hyper_parallel.factory_calls import records_call
from hyper_parallel.models._factory import create_spec, overrides_check
from hyper_parallel.models.llama3._runtime import (
    Llama3StateDictAdapter,
    build_model,
    init_parameter,
    parallelize,
)
from hyper_parallel.models.llama3.args import LLAMA3_FLAVORS, Llama3Args, RopeScaling
from hyper_parallel.models.spec import ModelSpec

__all__ = ["LLAMA3_FLAVORS", "Llama3Args", "Llama3Flavor", "RopeScaling", "create_model_spec"]

#: The flavors of ``LLAMA3_FLAVORS``, as a closed choice for the resolver and ``--help``.
Llama3Flavor = Literal["debugmodel", "1B", "3B", "8B", "70B", "405B", "auto"]


@records_call
def create_model_spec(
    flavor: Llama3Flavor | None = None,
    weights_path: str | None = None,
    overrides: dict[str, int | float | bool | str | None] | None = None,
) -> ModelSpec:
    """Describe a Llama 3 model of ``flavor``, optionally with ``overrides`` of single arguments.

    ``overrides`` maps argument names (dotted for ``rope_scaling.*``) to new values; unknown names,
    mistyped values and inconsistent dimensions raise ``ValueError``.

    Args:
        flavor: debugmodel, 8B, 70B, 405B, or auto: weights_path's config.json (default if set, else 8B).
        weights_path: Safetensors weights folder, or a Hub id org/name[@revision]; null trains from scratch.
        overrides: Single architecture arguments replacing the flavor's, e.g. {rope_scaling.factor: 16.0}.
    """
    return create_spec(
        "llama3",
        LLAMA3_FLAVORS,
        flavor,
        weights_path,
        overrides,
        default="8B",
        build_model_fn=build_model,
        parallelize_fn=parallelize,
        state_dict_adapter=Llama3StateDictAdapter,
        init_fn=init_parameter,
    )


create_model_spec.check_arguments = overrides_check(LLAMA3_FLAVORS)  # type: ignore[attr-defined]
