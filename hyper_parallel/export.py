"""Export a training checkpoint to a Hugging Face safetensors folder that ``transformers`` loads.

``python -m hyper_parallel.export CKPT OUT [--dtype float32|bfloat16|float16] [--max-shard-size 5GB]
[--config-file FILE]`` and ``export_checkpoint(CKPT, OUT, ...)`` read the model weights of a DCP
checkpoint on one process, whatever layout saved them (one process, FSDP2, tensor parallelism), and write
``OUT/config.json`` plus ``OUT/model.safetensors``, or, above ``max_shard_size``,
``model-0000i-of-0000n.safetensors`` shards with ``model.safetensors.index.json``: the layout
``AutoModelForCausalLM.from_pretrained(OUT)`` reads. The run's tokenizer is written beside the weights
(``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``; the byte tokenizer as an
equivalent ``tokenizer.json``, see ``components.tokenizer._export``), so
``AutoTokenizer.from_pretrained(OUT)`` and ``python -m hyper_parallel.generate OUT`` need the folder
alone; it encodes as training did (BOS as configured). ``config.json`` and ``generation_config.json``
carry the tokenizer's ``bos_token_id`` / ``eos_token_id`` / ``pad_token_id``, so transformers'
``generate()`` stops at end of text. Every file's mode follows the umask.

``CKPT`` is a ``step-<N>`` folder (a full checkpoint or the final weights-only export) or a
``checkpoint.folder``, whose newest complete step is exported. The model comes from the resolved config the
run saved beside the weights (``step-<N>/config.yaml``) unless ``config`` / ``--config-file`` names one; its
state-dict adapter renames the weights to Hugging Face's layout and writes ``config.json``. ``dtype`` casts
the floating-point weights (default: as saved, so a final export keeps its ``export_dtype``).

The checkpoint is read as data (``components.checkpoint._safe_read``): its files are checked against the
checksum manifest saved with them, ``.metadata`` is unpickled by a loader that admits only DCP's metadata
classes, and a damaged or refused checkpoint is an ``ExportError`` naming the file; given a
``checkpoint.folder``, a damaged newest step is skipped with a warning for the newest intact one.

Errors a user can cause raise ``ExportError`` with a one-line message; the command prints it and exits 2.
``OUT`` must not exist or be an empty folder, and must not be a symbolic link (checked before anything is
read or written); it is written as ``.OUT.partial`` (created exclusively) and renamed when complete.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from hyper_parallel._disk import write_problem
from hyper_parallel._dtypes import DTYPE_NAMES, torch_dtype
from hyper_parallel._numbers import UNIT_NAMES, read_size
from hyper_parallel.trainer.machine import torch_version_problem

if TYPE_CHECKING:
    import torch

    from hyper_parallel.trainer.config import TrainerConfig

__all__ = [
    "DTYPES",
    "ExportError",
    "base_size_problem",
    "export_adapter",
    "export_checkpoint",
    "main",
    "parse_size",
    "read_checkpoint",
    "stored_model_sizes",
]

#: The dtypes ``dtype`` / ``--dtype`` accept.
DTYPES = DTYPE_NAMES
_log = logging.getLogger(__name__)
_SINGLE_PROCESS = r"torch\.distributed is (disabled, )?(unavailable or uninitialized|unavailable)"


class ExportError(ValueError):
    """A checkpoint, output folder or option the export cannot use; the message is one line."""


def parse_size(size: int | str) -> int:
    """Bytes of ``size``: an int, or a string like ``"5GB"`` (10^9 bytes), ``"500MiB"`` or ``"100"``."""
    if isinstance(size, int):
        value = size
    else:
        read = read_size(size)
        if read is None:
            raise ExportError(
                f"max_shard_size: cannot read {size!r} as a size; write bytes or a number with a unit "
                f"({UNIT_NAMES}), e.g. '5GB'"
            )
        value = read[0]
    if value < 1:
        raise ExportError(f"max_shard_size: must be at least 1 byte, got {size!r}")
    return value


def export_checkpoint(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    dtype: str | None = None,
    max_shard_size: int | str = "5GB",
    config: str | Path | TrainerConfig | None = None,
    accept_changed_base: bool = False,
) -> Path:
    """Write the model of ``checkpoint`` as a Hugging Face safetensors folder ``out_dir``; returns it.

    ``checkpoint`` is a ``step-<N>`` folder or a ``checkpoint.folder`` (its newest complete step).
    ``dtype`` (``float32``, ``bfloat16``, ``float16``; None keeps the saved dtypes) casts the floating-point
    weights; files above ``max_shard_size`` bytes (int, or ``"5GB"``-style) are split into shards with an
    index. ``config`` (a YAML file or a ``TrainerConfig``) replaces the ``config.yaml`` saved with the
    checkpoint. A LoRA/QLoRA checkpoint is merged only into the base its ``base.json`` names
    (``accept_changed_base`` takes the one ``model.weights_path`` holds now). Raises ``ExportError`` (one
    line) for anything the caller can fix.
    """
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"dtype: unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    limit = parse_size(max_shard_size)
    out = Path(out_dir)
    _check_output(out)
    found: dict[str, Any] = {}

    def before_read(cfg: TrainerConfig) -> None:  # what the config alone decides, before the weights
        adapter = cfg.model.state_dict_adapter(cfg.model.args)
        try:
            found["hf_config"] = adapter.hf_config()
        except NotImplementedError as exc:  # a model kind the export does not write yet: the input named
            raise ExportError(f"{checkpoint}: {exc}") from None
        except (AttributeError, ValueError) as exc:
            detail = str(exc) if not isinstance(exc, AttributeError) else "its adapter writes no config.json"
            raise ExportError(f"model {cfg.model.name} {cfg.model.flavor}: {detail}") from None
        files = {
            **_tokenizer_files(cfg),
            **_generation_files(cfg, found["hf_config"]),
            **_image_processor_files(cfg, found["hf_config"]),
        }
        found["adapter"], found["tokenizer"] = adapter, files

    step, cfg, weights = _read_newest(
        Path(checkpoint), config, before_read, purpose="export", accept_changed_base=accept_changed_base
    )
    weights = _merged(cfg, weights)
    adapter, hf_config, tokenizer = found["adapter"], found["hf_config"], found["tokenizer"]
    if dtype is not None:
        target = torch_dtype(dtype)
        weights = {k: v.to(target) if v.is_floating_point() else v for k, v in weights.items()}
    try:
        hf = adapter.to_hf(weights)
    except (KeyError, ValueError) as exc:  # weights of another model than the config describes
        raise ExportError(
            f"{str(step)!r} does not hold a {cfg.model.name} {cfg.model.flavor}: {exc}"
        ) from None
    if hf_config.get("tie_word_embeddings"):
        hf.pop("lm_head.weight", None)  # Hugging Face ties it to the embeddings on load
    floating = [t.dtype for t in hf.values() if t.is_floating_point()]
    hf_config["dtype"] = str(floating[0]).removeprefix("torch.") if floating else "float32"
    _write(out, hf, hf_config, limit, tokenizer)
    return out


def _merged(cfg: TrainerConfig, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` as a plain model's: the PEFT method's adapters merged into the layers they adapt.

    A checkpoint that left the frozen base out (``PEFT.Config.checkpoint_holds_base``) gets it back as the
    run built it (:func:`_rebuilt_base`) and held it (``PEFT.Config.merged``).
    """
    holds_base = cfg.peft.checkpoint_holds_base(cfg.model.weights_path)
    rebuild: Callable[[], dict[str, torch.Tensor]] | None = None if holds_base else lambda: _rebuilt_base(cfg)
    try:
        return cfg.peft.merged(weights, cfg.model.args, cfg.training.mixed_precision_param, rebuild)
    except ExportError:
        raise
    except (ImportError, ValueError) as exc:  # torchao missing for an NF4 base; adapters of another method
        raise ExportError(str(exc)) from None


def _rebuilt_base(cfg: TrainerConfig) -> dict[str, torch.Tensor]:
    """The frozen base model a LoRA run built at its start (float32, our names, no adapters).

    From ``model.weights_path`` when set, else drawn from the run's seed as the trainer draws it (each
    parameter from ``(seed, name)``, whatever the layout).
    """
    from hyper_parallel.errors import InputFileError
    from hyper_parallel.models import load_pretrained, materialize

    spec = cfg.model
    model = cfg.peft.apply(spec.build_model_fn(spec.args, device="meta"), spec.args)
    try:
        if spec.weights_path is not None:
            load_pretrained(model, spec, device="cpu")
        else:
            materialize(model, spec, device="cpu", seed=cfg.run_seed())
    except (OSError, KeyError, ValueError) as exc:
        detail = exc.issues[0] if isinstance(exc, InputFileError) else exc
        raise ExportError(
            f"the checkpoint holds LoRA adapters without their frozen base, which comes from "
            f"model.weights_path {spec.weights_path!r}: it cannot be read ({detail})"
        ) from None
    state = model.state_dict()
    adapters = set(cfg.peft.adapter_keys(state))
    return {name: tensor for name, tensor in state.items() if name not in adapters}


def export_adapter(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    config: str | Path | TrainerConfig | None = None,
    accept_changed_base: bool = False,
) -> Path:
    """Write the LoRA adapters of ``checkpoint`` as a ``peft`` adapter folder ``out_dir``; returns it.

    ``adapter_config.json`` and ``adapter_model.safetensors`` (float32, the ``peft`` library's key
    names and module names of the Hugging Face model ``export_checkpoint`` writes), so
    ``peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), out_dir)`` gives the
    merged export's model. ``BASE`` is the base model (``model.weights_path``, written into
    ``base_model_name_or_path``; it must be the base ``base.json`` names, or ``accept_changed_base``).
    ``ExportError`` when the run trained no adapters.
    """
    out = Path(out_dir)
    _check_output(out)
    step, cfg, read = _read_newest(
        Path(checkpoint), config, purpose="export", accept_changed_base=accept_changed_base
    )
    adapter = cfg.model.state_dict_adapter(cfg.model.args)
    try:
        folder = cfg.peft.adapter_folder(read, adapter.to_hf)
    except (KeyError, ValueError) as exc:
        raise ExportError(f"the adapters of {str(step)!r} cannot be written for peft: {exc}") from None
    if folder is None:
        raise ExportError(f"{str(step)!r} was trained without LoRA (peft): it holds no adapters to export")
    tensors, adapter_config = folder
    if not tensors:
        raise ExportError(f"{str(step)!r} holds no LoRA adapters")
    adapter_config["base_model_name_or_path"] = cfg.model.weights_path
    _write_adapter(out, tensors, adapter_config)
    return out


def _write_adapter(out: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    """``adapter_config.json`` and ``adapter_model.safetensors`` as ``.OUT.partial``, then renamed; a
    failed write is :func:`_refuse_failed_write`'s, as for the merged model."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    partial = _partial(out)
    _check_output(out)
    if partial.is_dir():
        shutil.rmtree(partial)
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.mkdir()
    try:
        probe = partial / "adapter_config.json"
        probe.write_text(json.dumps(config, indent=2) + "\n")
        mode = probe.stat().st_mode & 0o777
        save_file(tensors, str(partial / "adapter_model.safetensors"), metadata={"format": "pt"})
        (partial / "adapter_model.safetensors").chmod(mode)
    except (OSError, SafetensorError) as exc:  # a full disk, a quota, a file-size limit
        _refuse_failed_write(out, partial, exc)
    if out.exists():
        out.rmdir()
    partial.rename(out)


def read_checkpoint(
    checkpoint: str | Path,
    config: str | Path | TrainerConfig | None = None,
    *,
    accept_changed_base: bool = False,
) -> tuple[Path, TrainerConfig, dict[str, torch.Tensor]]:
    """The step folder, the run's config and the full model weights (our names) of ``checkpoint``.

    ``checkpoint`` and ``config`` are as in :func:`export_checkpoint` (a step folder or its parent, whose
    newest intact step is read; the config saved beside the weights unless one is given). LoRA's
    adapters come merged into the layers they adapt: the weights are those of a plain model (the base its
    ``base.json`` names, see :func:`export_checkpoint`). Read safely in this process; raises
    ``ExportError`` (one line) for anything the caller can fix.
    """
    step, cfg, weights = _read_newest(Path(checkpoint), config, accept_changed_base=accept_changed_base)
    return step, cfg, _merged(cfg, weights)


def _tokenizer_files(cfg: TrainerConfig) -> dict[str, bytes]:
    from hyper_parallel.components.tokenizer._export import tokenizer_files

    try:
        return tokenizer_files(cfg.tokenizer, cfg.model.weights_path)
    except (NotImplementedError, ValueError) as exc:
        raise ExportError(str(exc)) from None


def _image_processor_files(cfg: TrainerConfig, hf_config: dict[str, Any]) -> dict[str, bytes]:
    """``preprocessor_config.json`` of a vision-language model: how training prepared its images.

    In the Qwen image processors' terms (RGB, pixels / 255, mean 0.5 and std 0.5 per channel, resized
    to whole merged patches between ``min_pixels`` and ``max_pixels``); the pixel bounds are the training
    data's (``image_chat``) or the dataset defaults. ``generate`` reads the bounds back from it.
    """
    from hyper_parallel.components.dataloader import NoSource

    vision = hf_config.get("vision_config")
    if not isinstance(vision, dict):
        return {}
    low, high = getattr(cfg.dataloader, "dataset", NoSource()).pixel_bounds()
    processor = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "do_convert_rgb": True,
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "patch_size": vision["patch_size"],
        "temporal_patch_size": vision["temporal_patch_size"],
        "merge_size": vision["spatial_merge_size"],
        "min_pixels": low,
        "max_pixels": high,
        "size": {"shortest_edge": low, "longest_edge": high},
    }
    return {"preprocessor_config.json": (json.dumps(processor, indent=2) + "\n").encode("utf-8")}


def _generation_files(cfg: TrainerConfig, hf_config: dict[str, Any]) -> dict[str, bytes]:
    """``generation_config.json``, with the tokenizer's special ids also set in ``hf_config``.

    transformers' ``generate()`` stops at ``eos_token_id`` and pads with ``pad_token_id``; without them
    it runs to ``max_new_tokens`` past the end of text training taught the model to emit.
    """
    from hyper_parallel.components.tokenizer._export import special_token_ids

    try:
        ids = special_token_ids(cfg.tokenizer, cfg.model.weights_path)
    except (NotImplementedError, ValueError) as exc:
        raise ExportError(str(exc)) from None
    hf_config.update(ids)
    generation = {**ids, "_from_model_config": False}
    return {"generation_config.json": (json.dumps(generation, indent=2) + "\n").encode("utf-8")}


def _read_newest(
    path: Path,
    config: str | Path | TrainerConfig | None,
    before_read: Callable[[TrainerConfig], None] | None = None,
    *,
    purpose: str = "read",
    accept_changed_base: bool = False,
) -> tuple[Path, TrainerConfig, dict[str, torch.Tensor]]:
    """The step folder read, its config and model weights: ``path``, or its newest step that reads.

    The search (a damaged step skipped, a vanished one listed again) is ``_newest.newest_readable``'s, the
    one every reader of a checkpoint folder uses. ``before_read`` sees the config before the weights are
    read; before they are allocated, the model the config builds must match them (``_check_model``).
    """
    from hyper_parallel.components.checkpoint._newest import NoReadableStepError, newest_readable
    from hyper_parallel.components.checkpoint._safe_read import inspect

    def read(step: Path) -> tuple[TrainerConfig, dict[str, torch.Tensor]]:
        inspection = inspect(step)
        cfg = _run_config(step, config)
        _check_model(step, cfg, inspection.metadata)
        _check_base(step, cfg, accept_changed_base)
        if before_read is not None:
            try:
                before_read(cfg)
            except OSError as exc:  # a file the config names (its tokenizer), not the checkpoint
                raise ExportError(f"{exc.filename or ''}: {exc.strerror or exc}") from None
        weights = _read_model(step, inspection.metadata)
        if not inspection.verified:
            _log.warning("%s holds no checksums.json (saved by an older version): read unverified", step)
        return cfg, weights

    try:
        step, (cfg, weights) = newest_readable(path, read, purpose=purpose)
    except NoReadableStepError as exc:
        raise ExportError(str(exc)) from None
    return step, cfg, weights


def stored_model_sizes(metadata: Any) -> dict[str, list[int]]:
    """The model tensors' sizes in a checkpoint's (checked) metadata, by our names."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    return {
        key.removeprefix("model."): list(item.size)
        for key, item in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(item, TensorStorageMetadata)
    }


def _check_base(step: Path, cfg: TrainerConfig, accept: bool) -> None:
    """Refuse a checkpoint without its frozen base when the base its config builds is not the one its
    ``base.json`` records (``components.checkpoint._base_record``), unless ``accept``; the base's identity
    is read from its files' headers and sampled values, before anything is built."""
    from hyper_parallel.components.checkpoint._base_record import (
        BASE_FILE,
        base_identity,
        changes,
        read_record,
    )
    from hyper_parallel.errors import InputFileError
    from hyper_parallel.models import parameter_count

    if cfg.peft.checkpoint_holds_base(cfg.model.weights_path):
        return
    try:
        saved = read_record(step)
        if saved is None:
            return
        current = base_identity(
            cfg.model.weights_path, parameters=parameter_count(cfg.model.args), seed=cfg.run_seed()
        )
    except InputFileError as exc:
        raise ExportError(str(exc.issues[0])) from None
    found = changes(saved, current)
    if not found:
        return
    where = cfg.model.weights_path
    base = f"model.weights_path {where!r}" if where is not None else "the base drawn from the run's seed"
    if accept:
        _log.warning("%s: %s differs (%s): accepted", step / BASE_FILE, base, "; ".join(found))
        return
    raise ExportError(
        f"{step / BASE_FILE}: {base} is not the frozen base this checkpoint's adapters were trained on "
        f"({'; '.join(found)}); pass --accept-changed-base (accept_changed_base=True) to use it anyway"
    )


def base_size_problem(step: Path, cfg: TrainerConfig) -> str | None:
    """For a checkpoint without its base: why the config's base cannot be the one built again, or None.

    The base the config describes must fit the values its weights folder stores (the headers, bounded) or,
    drawn from the seed, have the parameter count ``base.json`` recorded: a ``vocab_size`` of 2^21 or
    100,000 layers in ``config.yaml`` is refused before the base is built or drawn.
    """
    from hyper_parallel.components.checkpoint._base_record import BASE_FILE, read_record
    from hyper_parallel.errors import InputFileError
    from hyper_parallel.models import folder_values, parameter_count, size_problem

    try:
        if cfg.model.weights_path is not None:
            folder = Path(cfg.model.weights_path)
            problem = size_problem(cfg.model.args, folder_values(folder))
            return None if problem is None else f"{folder}: {problem}"
        saved = read_record(step)
    except InputFileError as exc:
        return str(exc.issues[0])
    count = parameter_count(cfg.model.args)
    recorded = None if saved is None else saved.get("parameters")
    if count is None or not isinstance(recorded, int) or count == recorded:
        return None
    return (
        f"{step / BASE_FILE}: its config describes a base of {count:,} parameters and the base this "
        f"checkpoint was trained on had {recorded:,}: the config does not describe these adapters"
    )


def _check_model(step: Path, cfg: TrainerConfig, metadata: Any) -> None:
    """Refuse a config whose model is not the one stored in ``step``, before any weight is allocated.

    The parameter count first (from the arguments alone: a config of 100,000 layers is never built), then
    each tensor's shape against the model built on ``meta``: a tensor the model has and the checkpoint
    lacks or stores at another size is ``.metadata: tensor NAME: ...``.
    """
    import math

    from hyper_parallel.models import size_problem

    stored = stored_model_sizes(metadata)
    if not stored:
        raise ExportError(f"{str(step)!r} holds no model weights")
    meta_file = step / ".metadata"
    # A LoRA run whose base is built again at every start saved its adapters alone (the base is rebuilt).
    rebuilt = not cfg.peft.checkpoint_holds_base(cfg.model.weights_path)
    if rebuilt:  # sized by the base it is built from (its folder's headers, or the record)
        base_problem = base_size_problem(step, cfg)
        if base_problem is not None:
            raise ExportError(base_problem)
    problem = size_problem(cfg.model.args, sum(math.prod(size) for size in stored.values()))
    if problem is not None and not rebuilt:
        raise ExportError(f"{meta_file}: {problem}")
    model = cfg.peft.apply(cfg.model.build_model_fn(cfg.model.args, device="meta"), cfg.model.args)  # LoRA
    ours = model.state_dict()
    frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    for name, tensor in ours.items():
        if name not in stored and rebuilt and name in frozen:
            continue
        if name not in stored:
            raise ExportError(f"{meta_file}: tensor model.{name}: missing; the config's model has it")
        if stored[name] != list(tensor.shape):
            raise ExportError(
                f"{meta_file}: tensor model.{name}: saved of size {stored[name]}, the config's model "
                f"has {list(tensor.shape)}"
            )
    extra = sorted(name for name in stored if name not in ours)
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise ExportError(
            f"{meta_file}: tensor model.{extra[0]}{more}: saved, and the config's model has no such tensor"
        )


def _run_config(step: Path, config: str | Path | TrainerConfig | None) -> TrainerConfig:
    from hyper_parallel.components.checkpoint._layout import CONFIG_FILE
    from hyper_parallel.config import ConfigError, load_config

    if config is not None and not isinstance(config, (str, Path)):
        return config
    path = Path(config) if config is not None else step / CONFIG_FILE
    if not path.is_file():
        if path.exists():  # a FIFO, a device, a folder: reading it could wait forever
            raise ExportError(f"config file {str(path)!r} is not a regular file")
        if config is not None:
            raise ExportError(f"config file {str(path)!r} does not exist")
        raise ExportError(
            f"{str(step)!r} holds no {CONFIG_FILE} (saved by an older version): pass the run's config "
            "with --config-file (config= in Python)"
        )
    try:
        return load_config(path)
    except ConfigError as exc:
        raise ExportError(f"{str(path)!r} does not resolve: {exc.issues[0]}") from None


def _read_model(step: Path, metadata: Any) -> dict[str, torch.Tensor]:
    """The full (unsharded) model tensors of a DCP checkpoint, by name, read in this process."""
    import torch
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load

    from hyper_parallel.components.checkpoint._safe_read import (
        SafePlanner,
        SafeReader,
        UnreadableCheckpointError,
        unreadable,
    )

    # Sizes checked to be tiled by stored chunks (``inspect``); zeros all the same, so that nothing but
    # stored values or zeros could ever reach a published file.
    model = {
        key.removeprefix("model."): torch.zeros(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }
    if not model:
        raise ExportError(f"{str(step)!r} holds no model weights")
    reader = SafeReader(str(step))
    with warnings.catch_warnings():  # one process reading on purpose: DCP's warning says nothing new
        warnings.filterwarnings("ignore", message=_SINGLE_PROCESS, category=UserWarning)
        try:
            load(
                {"model": model},
                checkpoint_id=str(step),
                storage_reader=reader,
                planner=SafePlanner(reader),
                no_dist=True,
            )
        except CheckpointException as exc:
            for failure, _trace in exc.failures.values():
                if isinstance(failure, UnreadableCheckpointError):
                    raise UnreadableCheckpointError(str(failure)) from None
            raise unreadable(step, exc) from None
    return model


def _partial(out: Path) -> Path:
    return out.parent / f".{out.name}.partial"


def _check_output(out: Path) -> None:
    """Refuse an output that is a symbolic link (or whose partial folder is) or a non-empty folder.

    Checked with ``lstat`` before anything is read or written: the export never writes through a link.
    """
    for path in (out, _partial(out)):
        if path.is_symlink():
            raise ExportError(
                f"{str(path)!r} is a symbolic link; the export never writes through one: remove it or "
                "choose a new output folder"
            )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{str(out)!r} exists and is not an empty folder; choose a new output folder")


def _shards(tensors: dict[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    """Consecutive groups of tensors of at most ``limit`` bytes (a bigger tensor is a shard alone)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def _write(
    out: Path,
    tensors: dict[str, torch.Tensor],
    config: dict[str, Any],
    limit: int,
    extra: dict[str, bytes],
) -> None:
    """Write the folder as ``.OUT.partial``, then rename it; ``extra`` maps more file names to contents.

    A write that fails (a full disk: ENOSPC, a quota) removes the partial folder and is an ``ExportError``.
    """
    from safetensors import SafetensorError

    partial = _partial(out)
    _check_output(out)  # again, just before writing
    if partial.is_dir():  # a stale real folder of an interrupted export (links were refused above)
        shutil.rmtree(partial)
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.mkdir()  # exclusive: fails if anything took its place
    try:
        _write_files(partial, tensors, config, limit, extra)
    except (OSError, SafetensorError) as exc:  # a full disk, a quota, a file-size limit
        _refuse_failed_write(out, partial, exc)
    if out.exists():
        out.rmdir()  # checked empty above
    partial.rename(out)


def _refuse_failed_write(out: Path, partial: Path, exc: Exception) -> NoReturn:
    """Remove the partial folder of a write that failed (ENOSPC, EDQUOT, EFBIG, ...) and raise the
    ``ExportError`` naming the output and the reason: nothing is published."""
    shutil.rmtree(partial, ignore_errors=True)
    detail = write_problem(exc) if isinstance(exc, OSError) else str(exc).splitlines()[0]
    raise ExportError(
        f"{str(out)!r}: {detail}; nothing was published: free space or choose another output folder"
    ) from None


def _write_files(
    partial: Path,
    tensors: dict[str, torch.Tensor],
    config: dict[str, Any],
    limit: int,
    extra: dict[str, bytes],
) -> None:
    """The files of ``_write`` into the partial folder."""
    from safetensors.torch import save_file

    # safetensors creates its files 0600; every file gets the mode open() would give it (the umask's),
    # read from a file created the ordinary way rather than by changing the process-wide umask.
    probe = partial / "config.json"
    probe.write_text(json.dumps(config, indent=2) + "\n")
    mode = probe.stat().st_mode & 0o777
    shards = _shards({k: v.detach().contiguous() for k, v in tensors.items()}, limit)
    metadata = {"format": "pt"}  # transformers refuses safetensors files without it
    if len(shards) == 1:
        save_file(shards[0], str(partial / "model.safetensors"), metadata=metadata)
    else:
        weight_map: dict[str, str] = {}
        for number, shard in enumerate(shards, start=1):
            name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(partial / name), metadata=metadata)
            weight_map.update(dict.fromkeys(shard, name))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (partial / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    for name, content in extra.items():
        (partial / name).write_bytes(content)
    for file in partial.iterdir():
        file.chmod(mode)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (0 exported, 2 an input error, printed on one line)."""
    parser = argparse.ArgumentParser(
        prog="python -m hyper_parallel.export",
        description="Export a checkpoint (a step-<N> folder, or checkpoint.folder for its newest step) "
        "to a Hugging Face safetensors folder.",
    )
    parser.add_argument("checkpoint", help="step-<N> folder or checkpoint.folder")
    parser.add_argument("out", help="output folder (must not exist or be empty)")
    parser.add_argument("--dtype", help=f"cast floating-point weights to one of {', '.join(DTYPES)}")
    parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors file (default 5GB)")
    parser.add_argument("--config-file", help="the run's config, when the checkpoint holds no config.yaml")
    parser.add_argument(
        "--accept-changed-base",
        action="store_true",
        help="merge LoRA adapters into model.weights_path even when it differs from the base they were "
        "trained on (base.json)",
    )
    parser.add_argument(
        "--adapter-only",
        action="store_true",
        help="write the LoRA adapters as a peft adapter folder instead of the merged model",
    )
    args = parser.parse_args(argv)
    old_torch = torch_version_problem()
    if old_torch is not None:  # refused as the launch scripts refuse it, before torch is used
        print(f"export: {old_torch}", file=sys.stderr)
        return 2
    try:
        if args.adapter_only:
            out = export_adapter(
                args.checkpoint,
                args.out,
                config=args.config_file,
                accept_changed_base=args.accept_changed_base,
            )
        else:
            out = export_checkpoint(
                args.checkpoint,
                args.out,
                dtype=args.dtype,
                max_shard_size=args.max_shard_size,
                config=args.config_file,
                accept_changed_base=args.accept_changed_base,
            )
    except ExportError as exc:
        print(f"export: {exc}", file=sys.stderr)
        return 2
    files = sorted(p.name for p in out.iterdir())
    print(f"exported {args.checkpoint} to {out}: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    from hyper_parallel._cli import run

    run(main)
