"""Model sizes no machine could hold, refused by ``--dry-run`` and the launch alike (with the count).

A config (or an override, ``--model.overrides.n_layers 10000000``) describing a model of trillions of
parameters resolved, and the preflight printed its 272 TiB per rank without a word: the launch would
then spend minutes building it before the allocator gave up. ``MAX_PARAMETERS`` is 2^42 (4.4 T), four
times the largest openly trained model (about 1 T parameters); counting needs the architecture arguments
alone (``ModelCosts.parameters()``), so the check costs microseconds and never depends on the layout or
world size.

Why a fixed count and not memory (reviewed for issue 36): the dry-run plans for a machine it may not run
on (a laptop checking a cluster's config), so the bound must not depend on this machine; memory per rank
is the preflight's report (``--device-memory``), not a refusal. The bound is there to catch values wrong
by orders of magnitude (a layer count or width with extra digits), which land far above it. A model near
it is not impossible in principle (2^42 parameters with Adam's fp32 states is about 70 TB, the memory of
some 500 H200s), only beyond anything trained so far; raising the constant is the whole change when that
becomes real.
"""

from typing import TYPE_CHECKING

from hyper_parallel.preflight.estimate import model_costs
from hyper_parallel.preflight.model import parameter_total

if TYPE_CHECKING:
    from hyper_parallel.preflight.inputs import RunConfig

__all__ = ["MAX_PARAMETERS", "size_issues"]

#: Most parameters a model may have (2^42, about 4.4 T).
MAX_PARAMETERS = 1 << 42


def size_issues(cfg: "RunConfig") -> list[tuple[str, str]]:
    """``(field path, message)`` when ``cfg``'s model has more than ``MAX_PARAMETERS`` parameters."""
    costs = model_costs(cfg)
    if costs is None:
        return []
    count = parameter_total(costs)
    if count <= MAX_PARAMETERS:
        return []
    return [
        (
            "model",
            f"{cfg.model.name} {cfg.model.flavor} with these arguments has {count:,} parameters, more than "
            f"{MAX_PARAMETERS:,} (2^42, four times the largest model trained in the open): no machine holds "
            "it; check the model's overrides (a layer count, width or vocabulary)",
        )
    ]
