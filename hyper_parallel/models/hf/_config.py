"""A folder's ``config.json`` as the arguments of a transformers causal LM: read, checked, overridden.

Refused in one line each: a folder without a readable ``config.json``; a config that needs remote code
(``auto_map``: transformers would run Python from the folder, which this project never does); a
``model_type`` transformers does not know, or knows without a causal LM; an ``overrides`` key its config
class does not have (with the closest one). transformers is imported inside the function, never at import.
"""

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyper_parallel.models._factory import CONFIG_JSON_BYTES

__all__ = ["read_config"]


def _load(path: str) -> dict[str, Any]:
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"{path}: is not a directory on this machine")
    file = folder / "config.json"
    if not file.is_file():
        raise ValueError(f"{file}: does not exist (a transformers model folder holds its config.json)")
    if file.stat().st_size > CONFIG_JSON_BYTES:
        raise ValueError(f"{file}: larger than {CONFIG_JSON_BYTES} bytes: not a model's config.json")
    try:
        config = json.loads(file.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{file}: not a JSON file: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file}: not a JSON object")
    return config


def read_config(path: str, overrides: Mapping[str, Any] | None) -> str:
    """``path``'s ``config.json`` with ``overrides`` applied, checked by transformers, as canonical JSON.

    Raises ``ValueError`` (one line naming the file) for a folder transformers' ``AutoModelForCausalLM``
    cannot build from without remote code, and the config layer's ``Problems`` (each at
    ``overrides.<key>``) for overrides its config class does not have or refuses.
    """
    from hyper_parallel.config.validation import Problem, Problems
    from hyper_parallel.models._factory import suggest

    file = Path(path) / "config.json"
    config = _load(path)
    if "auto_map" in config:
        raise ValueError(
            f"{file}: names code of its own (auto_map), which would need trust_remote_code; this project "
            "never runs code from a model folder"
        )
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise ValueError(f"{file}: has no model_type")
    try:
        from transformers import CONFIG_MAPPING, MODEL_FOR_CAUSAL_LM_MAPPING
    except ImportError:
        raise ValueError(
            "the transformers model target needs transformers: pip install 'hyper_parallel[hf]'"
        ) from None

    if model_type not in CONFIG_MAPPING:
        import transformers

        hint = suggest(model_type, CONFIG_MAPPING.keys())
        raise ValueError(
            f"{file}: model_type {model_type!r} is not a model transformers {transformers.__version__} "
            f"knows{hint}"
        )
    config_class = CONFIG_MAPPING[model_type]
    if config_class not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ValueError(f"{file}: transformers has no causal LM for model_type {model_type!r}")
    known = set(config_class().to_dict()) | set(getattr(config_class, "attribute_map", {}))
    problems = [
        Problem(
            ("overrides", str(key)),
            f"{key!r} is not a field of {config_class.__name__}" + suggest(str(key), known),
            "key",
        )
        for key in overrides or {}
        if key not in known or key == "model_type"
    ]
    if problems:
        raise Problems(f"invalid config.json overrides for {model_type}", problems)
    merged = {**config, **(overrides or {})}
    fields = {k: v for k, v in merged.items() if k != "model_type"}
    try:
        built = config_class(**fields)
    except Exception as exc:  # transformers' validators raise their own classes
        detail = " ".join(str(exc).split())
        raise ValueError(
            f"{file} with model.overrides: {config_class.__name__} refuses it: {detail}"
        ) from None
    if getattr(built, "is_encoder_decoder", False):
        raise ValueError(f"{file}: {model_type!r} is an encoder-decoder model, not a causal LM")
    return json.dumps(merged, sort_keys=True)
