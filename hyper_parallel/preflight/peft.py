"""What parameter-efficient fine-tuning changes in the preflight: the tensors that train and those frozen.

Without ``peft`` (full fine-tuning) every parameter trains: float32 master, float32 gradient, the
optimizer's float32 states. With LoRA (``peft: LoRA.Config``) only the adapters do: each targeted linear
layer of the blocks (``ParamGroup.linears`` names them) gets ``A`` (``rank x in``) and ``B``
(``out x rank``). The base is frozen: no gradient, no optimizer state, each part held as the method's
``storage`` says (the runtime and the export read the same statement), NF4 weights counted by
:func:`nf4_bytes`. The method answers (``PEFT.Config.roles``); this module asks it with the run's model
and compute dtype. Torch-free, as the whole preflight.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hyper_parallel.components.peft.storage import (
    NF4_BLOCK,
    NF4_QUANTUM,
    NF4_SCALER_BLOCK,
    Role,
    Roles,
    nf4_bytes,
)
from hyper_parallel.preflight.model import ParamGroup

if TYPE_CHECKING:
    from hyper_parallel.preflight.inputs import RunConfig

__all__ = ["NF4_BLOCK", "NF4_QUANTUM", "NF4_SCALER_BLOCK", "Role", "Roles", "nf4_bytes", "roles"]


def roles(cfg: "RunConfig", groups: Sequence[ParamGroup]) -> Roles:
    """The groups of ``cfg``'s model (its ``ModelCosts.parameters()``) and what its ``peft`` adds, by role.

    A group shared by several linear layers (``linears``) is split into one group per layer, so that a
    layer LoRA adapts and one it does not are told apart.
    """
    return cfg.peft.roles(groups, cfg.model.args, cfg.training.mixed_precision_param)
