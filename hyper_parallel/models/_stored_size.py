"""A model's size from its arguments against the values its weights store, before anything is built.

``generate``, ``export`` and ``evaluate`` build a model from a config that travels with the weights
(``config.json`` of an exported folder, ``config.yaml`` of a checkpoint step, the run's config): a
``num_hidden_layers: 100000`` in it made generate build 100,000 blocks for minutes and gigabytes before the
weights were read. The parameter count follows from the arguments without torch (the preflight's
``ModelCosts.parameters()``), and the values stored follow from a checkpoint's metadata or the safetensors
headers; a model larger than what is stored cannot be what the weights hold, so it is refused before
anything is built. The stored values may exceed the count (tied tensors saved under both names, buffers),
never fall short of it: the exact comparison, tensor by tensor, follows on a ``meta`` model once its
size is known to be bounded by the files.
"""

from __future__ import annotations

from typing import Any

__all__ = ["folder_values", "parameter_count", "size_problem"]


def parameter_count(args: Any) -> int | None:
    """Parameters of the model ``args`` builds (tied tensors once), or None when it offers no preflight."""
    preflight = getattr(args, "preflight", None)
    if not callable(preflight):
        return None
    from hyper_parallel.preflight.model import parameter_total

    return parameter_total(preflight())


def size_problem(args: Any, stored: int) -> str | None:
    """Why the model ``args`` builds cannot be the ``stored`` values (a count of elements), or None."""
    count = parameter_count(args)
    if count is None or count <= stored:
        return None
    return (
        f"its config describes a model of {count:,} parameters and the weights store {stored:,} values: the "
        "config does not describe these weights (a layer count, width or vocabulary that differs)"
    )


def folder_values(folder: Any) -> int:
    """The values the safetensors files of weights ``folder`` store, from their headers alone (bounded:
    :func:`~hyper_parallel.models._weights_check.read_header`); ``InputFileError`` for a bad header."""
    import math

    from hyper_parallel.models._weights_check import read_header, weight_files

    return sum(math.prod(e.shape) for file in weight_files(folder) for e in read_header(file).values())
