"""Checking a pretrained weights folder against the model before anything is built or allocated.

``model.weights_path`` names a Hugging Face folder: ``config.json`` and ``*.safetensors`` files (sharded
through ``model.safetensors.index.json`` or not). A wrong folder used to fail deep inside the load (a
``KeyError``, a size mismatch, an integer tensor cast to floats without a word) after the model was built
and sharded. ``check_weights`` answers first, reading only headers and ``config.json``:

- ``config.json`` (required: every Hugging Face folder holds one) against the model's arguments (the
  adapter's ``hf_config``), naming each field that differs and the flavor or ``model.overrides.X`` that
  fits it;
- every safetensors header, bounded and validated before any tensor is read (:func:`read_header`: a header
  longer than the format allows or than the file, offsets outside the file, sizes that disagree with the
  shape), so a hostile file cannot make the loader allocate;
- the tensors' names, shapes and dtypes against the model's parameters (``ModelArgs.parameter_shapes``,
  computed from the arguments) through the state-dict adapter, the same mapping the load uses, run on
  shapes alone (:class:`~hyper_parallel.models._shapes.Shape`); integer tensors are refused.

Nothing here imports torch, so ``--dry-run`` runs the very check the launch runs and prints the same
words. Every finding is an ``InputFileError`` naming the file (exit status 2).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from hyper_parallel._json import loads
from hyper_parallel._paths import open_regular
from hyper_parallel.errors import InputFileError, Issue
from hyper_parallel.models._shapes import Shape

if TYPE_CHECKING:
    from hyper_parallel.models.spec import ModelSpec

__all__ = ["MAX_HEADER_BYTES", "check_tensors", "check_weights", "read_header", "weight_files"]

#: Longest safetensors header accepted (the format's own reader refuses longer ones too).
MAX_HEADER_BYTES = 100_000_000
#: Issues shown per finding (a wrong folder can differ in every tensor).
_SHOWN = 8

#: safetensors dtype codes and the size in bytes of one element.
_DTYPE_BYTES: dict[str, int] = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
#: The codes of floating-point tensors (what weights must hold).
_FLOATING = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})


@attrs.frozen
class TensorEntry:
    """One tensor of a safetensors header: its dtype code and shape."""

    dtype: str
    shape: tuple[int, ...]


def read_header(file: Path) -> dict[str, TensorEntry]:
    """The tensors a safetensors ``file`` holds (name -> dtype, shape), read and checked from its header.

    The header is refused, before anything else is read, when it claims more than
    :data:`MAX_HEADER_BYTES` or more bytes than the file holds; every tensor must have a known dtype, a
    shape of non-negative sizes and data offsets inside the file that match that shape. An
    ``InputFileError`` naming the file (and the tensor) otherwise.
    """
    try:
        size = file.stat().st_size
        with open_regular(file) as handle:  # a FIFO or a device is refused, never waited on
            head = handle.read(8)
            if len(head) < 8:
                raise InputFileError.at(
                    file, f"not a safetensors file: {size} bytes, shorter than its header"
                )
            length = int.from_bytes(head, "little")
            if length > MAX_HEADER_BYTES or length > size - 8:
                raise InputFileError.at(
                    file,
                    f"not a safetensors file: its header claims {length} bytes, the file holds {size} (at "
                    f"most {MAX_HEADER_BYTES} are accepted)",
                )
            raw = handle.read(length)
    except OSError as exc:
        raise InputFileError.at(file, f"cannot be read: {exc.strerror or exc}") from None
    try:
        header = loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputFileError.at(file, f"not a safetensors file: its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise InputFileError.at(file, "not a safetensors file: its header is not a JSON object")
    data_bytes = size - 8 - length
    entries: dict[str, TensorEntry] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        problem = _entry_problem(entry, data_bytes)
        if problem is not None:
            raise InputFileError.at(file, f"tensor {name!r}: {problem}")
        entries[name] = TensorEntry(entry["dtype"], tuple(entry["shape"]))
    return entries


def _entry_problem(entry: object, data_bytes: int) -> str | None:
    """What is wrong with one header entry, or None."""
    if not isinstance(entry, dict):
        return "its header entry is not a JSON object"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in _DTYPE_BYTES:
        return f"unknown dtype {str(dtype)[:40]!r}"
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape) or len(shape) > 8:
        return f"invalid shape {str(shape)[:60]}"
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(n) is int for n in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        return f"data offsets {str(offsets)[:60]} lie outside the file's {data_bytes} data bytes"
    if offsets[1] - offsets[0] != math.prod(shape) * _DTYPE_BYTES[dtype]:
        return f"data offsets {offsets} do not hold a {dtype} tensor of shape {shape}"
    return None


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a weights folder: those its index names, else every ``*.safetensors``."""
    if not folder.is_dir():
        raise InputFileError.at(folder, "model.weights_path is not a folder")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = loads(index.read_bytes().decode("utf-8"))["weight_map"]
            names = sorted({str(name) for name in weight_map.values()})
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputFileError.at(index, f"not a safetensors index (no weight_map): {exc}") from None
        files = [folder / name for name in names]
        if any(Path(name).is_absolute() or ".." in Path(name).parts for name in names):
            raise InputFileError.at(index, "names a file outside the weights folder")
        missing = [file for file in files if not file.is_file()]
        if missing:
            raise InputFileError(Issue("", f"missing: {index.name} names it", str(file)) for file in missing)
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise InputFileError.at(folder, "no *.safetensors file in model.weights_path")
    return files


def check_weights(spec: ModelSpec) -> None:
    """Refuse a ``spec.weights_path`` folder that cannot load into ``spec``'s model (see the module doc).

    A model whose arguments do not list their parameters (``parameter_shapes`` is ``None``) is checked
    up to the headers: its files, ``config.json`` and dtypes."""
    assert spec.weights_path is not None
    folder = Path(spec.weights_path)
    files = weight_files(folder)  # a folder without weights is said as such before its config.json is read
    adapter = spec.state_dict_adapter(spec.args, spec.weights_path)
    _check_config_json(spec, adapter, folder / "config.json")
    _check_headers(spec, adapter, folder, files)


def check_tensors(spec: ModelSpec) -> None:
    """``check_weights`` without ``config.json``: the headers of ``spec.weights_path``'s files against the
    model's names, shapes and dtypes, before any tensor is read.

    Every reader of a weights folder runs it first (``load_pretrained``, ``generate``): a tensor the model
    lacks is refused, never read (a 256 GiB sparse extra tensor once passed the size check and was loaded
    whole), and a tensor of the model is read at the model's size.
    """
    assert spec.weights_path is not None
    folder = Path(spec.weights_path)
    files = weight_files(folder)
    _check_headers(spec, spec.state_dict_adapter(spec.args, spec.weights_path), folder, files)


def _check_headers(spec: ModelSpec, adapter: Any, folder: Path, files: list[Path]) -> None:
    """:func:`check_tensors` of ``folder``, its safetensors ``files`` listed (``weight_files``)."""
    headers = {file: read_header(file) for file in files}
    where: dict[str, Path] = {}
    placeholders: dict[str, Shape] = {}
    wrong_kind: list[Issue] = []
    for file, entries in headers.items():
        for name, entry in entries.items():
            where.setdefault(name, file)
            if entry.dtype not in _FLOATING:
                message = f"tensor {name!r} holds {entry.dtype} values: weights must be floating point"
                wrong_kind.append(Issue("", message, str(file)))
            placeholders[name] = Shape(entry.shape)
    _refuse(wrong_kind)
    listed = spec.args.parameter_shapes()
    if listed is None:
        return
    expected = {name: Shape(shape) for name, shape in listed.items()}
    what = f"{spec.name} {spec.flavor}"
    try:
        ours = adapter.from_hf(placeholders)
    except (KeyError, ValueError, RuntimeError) as exc:
        detail = exc.args[0] if exc.args else exc
        raise InputFileError.at(folder, f"these weights do not fit {what}: {detail}") from None
    missing = sorted(set(expected) - set(ours))
    unexpected = sorted(set(ours) - set(expected))
    issues: list[Issue] = []
    if missing:
        shown = ", ".join(repr(_hf_name(adapter, n, expected[n])) for n in missing[:_SHOWN])
        more = f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else ""
        issues.append(Issue("", f"lacks {len(missing)} tensor(s) {what} has: {shown}{more}", str(folder)))
    if unexpected:
        shown = ", ".join(repr(_hf_name(adapter, n, ours[n])) for n in unexpected[:_SHOWN])
        more = f" and {len(unexpected) - _SHOWN} more" if len(unexpected) > _SHOWN else ""
        message = f"holds {len(unexpected)} tensor(s) {what} does not have: {shown}{more}"
        issues.append(Issue("", message, str(folder)))
    for name in sorted(set(ours) & set(expected)):
        if tuple(ours[name].shape) != tuple(expected[name].shape):
            hf = _hf_name(adapter, name, expected[name])
            message = (
                f"tensor {hf!r} has shape {list(ours[name].shape)}; {what} expects "
                f"{list(expected[name].shape)}"
            )
            issues.append(Issue("", message, str(where.get(hf, folder))))
    _refuse(issues)


def _hf_name(adapter: Any, name: str, tensor: Shape) -> str:
    """The Hugging Face name of this model's parameter ``name`` (``name`` itself without a single one)."""
    try:
        names = list(adapter.to_hf({name: tensor}))
    except (KeyError, ValueError, RuntimeError):
        return name
    return names[0] if len(names) == 1 else name


def _refuse(issues: list[Issue]) -> None:
    if issues:
        shown = issues[:_SHOWN]
        if len(issues) > _SHOWN:
            location = shown[-1].location
            shown.append(Issue("", f"... and {len(issues) - _SHOWN} more", location))
        raise InputFileError(shown)


# -- config.json -----------------------------------------------------------------------------------------
#: ``config.json`` fields that say nothing about the tensors' layout.
_IGNORED = frozenset({"architectures", "dtype", "torch_dtype", "transformers_version"})


def _flat(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config.json`` fields, RoPE settings lifted out of ``rope_parameters`` (or older ``rope_scaling``)."""
    flat = {
        k: v for k, v in config.items() if k not in _IGNORED and k not in ("rope_parameters", "rope_scaling")
    }
    for section in ("rope_scaling", "rope_parameters"):
        nested = config.get(section)
        if isinstance(nested, dict):
            flat.update({k: v for k, v in nested.items() if k != "type"})
    return flat


def _same(a: object, b: object) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return not isinstance(b, bool) and math.isclose(a, b, rel_tol=1e-9)
    return a == b


def _differences(ours: Mapping[str, Any], saved: Mapping[str, Any]) -> list[str]:
    """The fields both configs hold that differ, in ``ours``'s order."""
    return [key for key, value in ours.items() if key in saved and not _same(value, saved[key])]


def _hf_config(adapter_type: Any, args: Any) -> dict[str, Any] | None:
    """The model's own ``config.json`` fields; a multimodal model's language-model part (its tower is
    checked by the tensors' shapes)."""
    try:
        config = adapter_type(args).hf_config()
    except (AttributeError, NotImplementedError, ValueError, TypeError):
        return None
    text = config.get("text_config")
    return _flat(text if isinstance(text, dict) else config)


def _check_config_json(spec: ModelSpec, adapter: Any, file: Path) -> None:
    """Refuse a ``config.json`` whose fields differ from the model's arguments, naming what fits."""
    if not file.is_file():
        raise InputFileError.at(
            file,
            "does not exist: model.weights_path is checked against the config.json every Hugging Face "
            "weights folder holds beside its *.safetensors files",
        )
    try:
        saved = loads(file.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputFileError.at(file, f"not a JSON file: {exc}") from None
    if not isinstance(saved, dict):
        raise InputFileError.at(file, "not a JSON object")
    if getattr(adapter, "reads_config_json", False):
        return  # the arguments are this config.json (with overrides): the tensors' shapes are checked
    ours = _hf_config(type(adapter), spec.args)
    if ours is None:
        return  # this model writes no Hugging Face config: nothing to compare with
    if ours.get("model_type") != saved.get("model_type") and isinstance(saved.get("text_config"), dict):
        saved = saved["text_config"]  # a multimodal config: the language model's fields
    flat = _flat(saved)
    differing = _differences(ours, flat)
    if not differing:
        return
    what = f"{spec.name} {spec.flavor}"
    issues = []
    fitting = _fitting_flavors(type(adapter), flat)
    if fitting:
        names = " or ".join(repr(name) for name in fitting)
        plain = " without model.overrides" if spec.flavor in fitting else ""
        issues.append(
            Issue("", f"model.flavor {names}{plain} fits this config.json; it differs in:", str(file))
        )
    else:
        issues.append(
            Issue("", f"{what} differs from this config.json (model.flavor auto reads it) in:", str(file))
        )
    for key in differing:
        hint = _override_hint(type(adapter), spec.args, key, flat[key])
        message = f"{key} is {flat[key]!r} here, {what} has {ours[key]!r}{hint}"
        issues.append(Issue("", message, str(file)))
    raise InputFileError(issues)


def _override_hint(adapter_type: Any, args: Any, key: str, wanted: object) -> str:
    """``"; model.overrides.X: V fits"`` for the one argument that gives ``config.json``'s ``key``."""
    for path, value in _arguments(args):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not isinstance(wanted, (int, float)) or isinstance(wanted, bool):
            continue
        candidate = type(value)(wanted) if isinstance(value, int) and float(wanted).is_integer() else wanted
        try:
            changed = _evolved(args, path, candidate)
        except (TypeError, ValueError):
            continue
        config = _hf_config(adapter_type, changed)
        if config is not None and key in config and _same(config[key], wanted):
            return f"; model.overrides.{path}: {candidate} fits"
    return ""


def _arguments(args: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted path, value)`` of every argument, nested sections included."""
    for field in attrs.fields(type(args)):
        value = getattr(args, field.name)
        if attrs.has(type(value)):
            yield from _arguments(value, f"{prefix}{field.name}.")
        else:
            yield f"{prefix}{field.name}", value


def _evolved(args: Any, path: str, value: object) -> Any:
    head, _, rest = path.partition(".")
    if rest:
        return attrs.evolve(args, **{head: _evolved(getattr(args, head), rest, value)})
    return attrs.evolve(args, **{head: value})


def _fitting_flavors(adapter_type: Any, saved: Mapping[str, Any]) -> list[str]:
    """The flavors of the model whose every field agrees with ``saved``."""
    flavors: Mapping[str, Any] = getattr(adapter_type, "flavors", {})
    fitting = []
    for name, args in flavors.items():
        config = _hf_config(adapter_type, args)
        if config is not None and not _differences(config, saved):
            fitting.append(name)
    return fitting
