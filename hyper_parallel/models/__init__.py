"""Model descriptions: ``ModelSpec`` and the ``ModelArgs`` base class; the weights of a built model.

Built-in model packages (``hyper_parallel.models.llama3``, ``hyper_parallel.models.qwen3_5``) expose a
``create_model_spec`` factory that the root ``model`` group names as its ``_target_``. At run time,
``materialize`` fills a parallelized (meta) model with layout-independent random weights, ``initialize``
does so in place, and ``load_pretrained`` loads Hugging Face weights into it (rank 0 reads, the others
receive their shards); ``check_weights`` checks a weights folder against a spec's model before anything
is built (``config.json``, safetensors headers, names, shapes and dtypes; ``check_tensors`` the headers
alone, which every reader of such a folder runs before reading a tensor); ``read_safetensors_folder``
reads such a folder's tensors (headers checked first); ``spec_from_hf_config`` rebuilds the spec an
exported ``config.json`` describes (``folder_spec``: as a recorded factory call; ``hf_folder_spec`` reads
it from an exported folder, ``is_hf_folder`` tells one); ``generate_ids`` decodes
with the models' inference cache;
``parameter_seed`` is the seed each named parameter is drawn from (adapters are drawn alike) and
``is_adapter`` tells an adapter's name (``LORA_A`` / ``LORA_B``), both torch-free;
``size_problem`` refuses a config larger than the weights it comes with (``folder_values``: what a
weights folder stores); ``AttentionPlan`` is how the models keep packed documents apart (the trainer
asks it which kernel compiled blocks take). They live in private modules and
are loaded on first access, so importing this package stays cheap. The device mesh comes from
``hyper_parallel.parallel``.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from hyper_parallel.models._names import LORA_A, LORA_B, is_adapter, parameter_seed
from hyper_parallel.models.spec import ModelArgs, ModelSpec

if TYPE_CHECKING:
    from hyper_parallel.models._hf_config import (
        folder_spec,
        hf_folder_spec,
        is_hf_folder,
        spec_from_hf_config,
    )
    from hyper_parallel.models._inference import generate_ids
    from hyper_parallel.models._layers import AttentionPlan
    from hyper_parallel.models._stored_size import folder_values, parameter_count, size_problem
    from hyper_parallel.models._weights import (
        initialize,
        load_pretrained,
        materialize,
        read_safetensors_folder,
    )
    from hyper_parallel.models._weights_check import (
        MAX_HEADER_BYTES,
        check_tensors,
        check_weights,
        weight_files,
    )

__all__ = [
    "LORA_A",
    "LORA_B",
    "MAX_HEADER_BYTES",
    "AttentionPlan",
    "ModelArgs",
    "ModelSpec",
    "check_tensors",
    "check_weights",
    "folder_spec",
    "folder_values",
    "generate_ids",
    "hf_folder_spec",
    "initialize",
    "is_adapter",
    "is_hf_folder",
    "load_pretrained",
    "materialize",
    "parameter_count",
    "parameter_seed",
    "read_safetensors_folder",
    "size_problem",
    "spec_from_hf_config",
    "weight_files",
]

#: Run-time names, each loaded on first access from the private torch module that defines it.
_LAZY = {
    "AttentionPlan": "_layers",
    "initialize": "_weights",
    "load_pretrained": "_weights",
    "materialize": "_weights",
    "read_safetensors_folder": "_weights",
    "check_tensors": "_weights_check",
    "check_weights": "_weights_check",
    "MAX_HEADER_BYTES": "_weights_check",
    "weight_files": "_weights_check",
    "spec_from_hf_config": "_hf_config",
    "folder_spec": "_hf_config",
    "hf_folder_spec": "_hf_config",
    "is_hf_folder": "_hf_config",
    "generate_ids": "_inference",
    "size_problem": "_stored_size",
    "folder_values": "_stored_size",
    "parameter_count": "_stored_size",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
