"""The ``ModelSpec`` of a Hugging Face ``config.json``: which built-in model reads a folder of weights.

A folder the export wrote (or any Hugging Face folder of a model we build) holds no config of ours; its
``model_type`` names the family and the family's state-dict adapter turns the rest back into our arguments
(``args_from_hf_config``, the inverse of ``hf_config``); any other ``model_type`` is a transformers causal
LM, built by the transformers path (``models.hf``) from the folder. Torch-free.
"""

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from hyper_parallel._json import loads
from hyper_parallel.models._factory import flavor_writing
from hyper_parallel.models.spec import ModelSpec

__all__ = ["HF_MODEL_TYPES", "folder_spec", "hf_folder_spec", "is_hf_folder", "spec_from_hf_config"]


def _llama3() -> tuple[Callable[..., ModelSpec], Mapping[str, Any]]:
    from hyper_parallel.models.llama3 import LLAMA3_FLAVORS, create_model_spec

    return create_model_spec, LLAMA3_FLAVORS


def _qwen3_5() -> tuple[Callable[..., ModelSpec], Mapping[str, Any]]:
    from hyper_parallel.models.qwen3_5 import QWEN3_5_FLAVORS, create_model_spec

    return create_model_spec, QWEN3_5_FLAVORS


def _qwen3_5_moe() -> tuple[Callable[..., ModelSpec], Mapping[str, Any]]:
    from hyper_parallel.models.qwen3_5_moe import QWEN3_5_MOE_FLAVORS, create_model_spec

    return create_model_spec, QWEN3_5_MOE_FLAVORS


#: ``model_type`` of ``config.json`` -> the family's factory and flavor table.
def _qwen3_5_vl() -> tuple[Callable[..., ModelSpec], Mapping[str, Any]]:
    from hyper_parallel.models.qwen3_5 import QWEN3_5_VL_FLAVORS, create_vl_model_spec

    return create_vl_model_spec, QWEN3_5_VL_FLAVORS


HF_MODEL_TYPES: dict[str, Callable[[], tuple[Callable[..., ModelSpec], Mapping[str, Any]]]] = {
    "llama": _llama3,
    "qwen3_5_text": _qwen3_5,
    "qwen3_5": _qwen3_5_vl,
    "qwen3_5_moe_text": _qwen3_5_moe,
}


def spec_from_hf_config(config: Mapping[str, Any], weights_path: str | None = None) -> ModelSpec:
    """The spec of the model ``config`` (a parsed ``config.json``) describes, loading ``weights_path``.

    Its flavor is the name of the table flavor that writes the same ``config.json``, else ``"config.json"``.
    A ``model_type`` of no native model is transformers' (``models.hf``: the folder a run of the
    transformers path exported), read from ``weights_path``'s ``config.json``. Raises ``ValueError`` (one
    line) for a ``model_type`` neither builds or arguments the model cannot express.
    """
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in HF_MODEL_TYPES:
        known = ", ".join(repr(name) for name in HF_MODEL_TYPES)
        refusal = f"model_type {model_type!r} is not a model this project builds (known: {known})"
        if not isinstance(model_type, str) or weights_path is None:
            raise ValueError(refusal)
        return _transformers_spec(weights_path, refusal)
    factory, flavors = HF_MODEL_TYPES[model_type]()
    template = factory()
    try:
        args = getattr(template.state_dict_adapter, "args_from_hf_config")(dict(config))  # noqa: B009
    except (KeyError, TypeError, ValueError) as exc:
        detail = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"model_type {model_type!r}: {detail}") from None
    flavor = flavor_writing(flavors, template.state_dict_adapter, args)
    return attrs.evolve(template, args=args, flavor=flavor or "config.json", weights_path=weights_path)


def _transformers_spec(weights_path: str, refusal: str) -> ModelSpec:
    """The transformers path's spec of the folder ``weights_path`` (``models.hf``, a recorded call), or
    ``ValueError`` with both refusals: the native models' (``refusal``) and transformers'."""
    from hyper_parallel.models.hf import create_model_spec

    try:
        return create_model_spec(path=weights_path)
    except ValueError as exc:
        detail = str(exc).removeprefix(f"{Path(weights_path) / 'config.json'}: ")  # the caller names it
        raise ValueError(f"{refusal}, and the transformers path refuses it: {detail}") from None


def folder_spec(config: Mapping[str, Any], folder: str) -> ModelSpec:
    """The spec a config naming the Hugging Face ``folder`` (``config`` its parsed ``config.json``) makes,
    as a recorded factory call, so that the config holding it still dumps: the native family's factory
    with ``weights_path`` (flavor auto reads the folder), else the transformers path's. ``ValueError``
    (one line) as :func:`spec_from_hf_config`."""
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in HF_MODEL_TYPES:
        factory, _ = HF_MODEL_TYPES[model_type]()
        return factory(weights_path=folder)
    return spec_from_hf_config(config, folder)


def is_hf_folder(path: Path) -> bool:
    """Whether ``path`` is a Hugging Face model folder (an export): ``config.json`` and safetensors."""
    return (path / "config.json").is_file() and (
        (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()
    )


def hf_folder_spec(folder: Path, *, recorded: bool = False) -> ModelSpec:
    """The ``ModelSpec`` of the Hugging Face ``folder`` (its ``config.json``: a native model's
    ``model_type``, else transformers' causal LM through the transformers path), loading its weights;
    ``recorded`` makes it as a config's factory call (:func:`folder_spec`: a config holding it dumps).
    ``ValueError`` (one line, ``'FOLDER/config.json': problem``) when no model this project builds is
    described: ``generate`` and ``evaluate`` read an exported folder alike."""
    config_file = folder / "config.json"
    try:
        hf_config = loads(config_file.read_text(encoding="utf-8"))
        if not isinstance(hf_config, dict):
            raise ValueError("not a JSON object")
        return (folder_spec if recorded else spec_from_hf_config)(hf_config, str(folder))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{str(config_file)!r}: {exc}") from None
