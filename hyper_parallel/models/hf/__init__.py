"""transformers' causal LMs: the ``create_model_spec`` factory named by ``model._target_``.

``model: {_target_: hyper_parallel.models.hf.create_model_spec, path: FOLDER}`` trains the model
transformers' ``AutoModelForCausalLM`` builds from ``FOLDER/config.json`` (Mistral, Qwen, Gemma, Phi,
OLMo...), with the folder's safetensors weights read through the project's reader (``init: random``
draws them instead: tests and from-scratch runs). The native models (``llama3``, ``qwen3_5``) stay the
fast path; this one is for every other architecture. The factory reads ``config.json`` and checks it with
transformers (imported inside, never at this module's import); remote code is never run. ``path`` may be a
Hugging Face Hub id (``org/name[@revision]``): its ``config.json`` is found in (or fetched into) the Hub
cache at resolve, its weights by the launch (``_hub``).
"""

from typing import Literal

from hyper_parallel.factory_calls import records_call
from hyper_parallel.models.hf._runtime import (
    HfStateDictAdapter,
    build_model,
    init_parameter,
    parallelize,
)
from hyper_parallel.models.hf.args import AttnImplementation, HfArgs
from hyper_parallel.models.spec import ModelSpec

__all__ = ["AttnImplementation", "HfArgs", "create_model_spec"]


@records_call
def create_model_spec(
    path: str,
    overrides: dict[str, int | float | bool | str | None] | None = None,
    init: Literal["pretrained", "random"] = "pretrained",
    attn_implementation: AttnImplementation = "sdpa",
) -> ModelSpec:
    """Describe the transformers causal LM of the folder ``path`` (its ``config.json``).

    Args:
        path: Folder of a transformers model (config.json, *.safetensors), or a Hub id org/name[@revision].
        overrides: config.json fields replacing the folder's, checked against the model's config class.
        init: 'pretrained' loads the folder's weights; 'random' draws them (transformers' initialisation).
        attn_implementation: transformers' attention: 'sdpa' or 'eager' (both keep packed documents apart).
    """
    from hyper_parallel._hub import CONFIG_FILES, is_hub_id, snapshot
    from hyper_parallel.models.hf._config import read_config

    if init not in ("pretrained", "random"):
        raise ValueError(f"init must be 'pretrained' or 'random', got {init!r}")
    hub_id = path if is_hub_id(path) else None
    folder = snapshot(path, CONFIG_FILES) if hub_id is not None else path
    args = HfArgs(
        config_json=read_config(folder, overrides), hub_id=hub_id, attn_implementation=attn_implementation
    )
    return ModelSpec(
        name="hf",
        flavor=args.model_type,
        args=args,
        weights_path=folder if init == "pretrained" else None,
        build_model_fn=build_model,
        parallelize_fn=parallelize,
        state_dict_adapter=HfStateDictAdapter,
        init_fn=init_parameter,
    )
