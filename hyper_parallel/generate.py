"""Continue a prompt with a trained model: ``python -m hyper_parallel.generate PATH --prompt TEXT``.

``[--chat [--system TEXT] [--history FILE]] [--image IMAGE] [--max-new-tokens N] [--temperature T]
[--top-p P] [--seed S] [--config-file C] [--device D] [--accept-changed-base]``

``PATH`` is a checkpoint (a ``step-<N>`` folder, or a ``checkpoint.folder`` whose newest intact step is read,
exactly as ``hyper_parallel.export`` reads it: checksums checked, nothing unpickled but DCP's metadata) or a
Hugging Face folder the export wrote (``config.json``, the safetensors weights and the tokenizer files). The
model is built by this project in one process, from the run's config (``config.yaml`` beside the weights,
or ``--config-file``) or from ``config.json``; a checkpoint and its export therefore hold the same weights
and give the same text.

Only the prompt and its continuation go to stdout (one text, then a newline); what was loaded goes to
stderr. ``--temperature 0`` (the default) decodes greedily; above it, tokens are drawn from the top
``--top-p`` of the distribution with a generator seeded by ``--seed``, so a seed repeats the text.
Decoding keeps a cache (keys and values of the attention blocks, the recurrent state of the Gated DeltaNet
blocks; a mixture-of-experts block routes each new token by itself and keeps nothing), so each new token
costs one token's forward. Generation stops at the end-of-sequence token. Llama 3, Qwen 3.5 and Qwen 3.5
MoE decode (the ``model_type`` of an exported ``config.json`` names which), and so does every causal LM of
the transformers path (``models.hf``: any other ``model_type``, its folder built as ``AutoModelForCausalLM``
builds it, transformers' own cache keeping what came before).

A Qwen 3.5 vision-language checkpoint decodes with ``--image IMAGE``: the prompt becomes a user turn of the
built-in chat format holding the image then the text, followed by the assistant's header, exactly as
``image_chat`` data trains (``hyper_parallel.data.chat``), and the continuation is the assistant's answer.
The image is read and resized as the training data's images are (the run's ``image_min_pixels`` and
``image_max_pixels``); the whole sequence is recomputed for each new token (no cache for images yet).

``--chat`` answers ``--prompt`` as a user message (after ``--system``'s, when given, and the earlier turns of
``--history``, a JSON chat record in any shape ``prepare`` reads): the conversation is
rendered through the run's chat template (``tokenizer.chat_template``: a preset, a file, the tokenizer's
own, else the built-in format; an export's ``tokenizer_config.json`` carries the one training used) with its
generation prompt, the assistant's header, exactly as training rendered its conversations
(``chat_prompt``). stdout is then the rendered prompt (special tokens left out) and the answer: the text
``--prompt`` would print had the same conversation been rendered by hand.

An input error (no such folder, not a checkpoint, an unreadable config or tokenizer, an option out of
range) prints ``generate: PATH: problem`` on one line and exits 2. torch is imported only after the
command line is read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyper_parallel._json import loads
from hyper_parallel.trainer.machine import torch_version_problem

if TYPE_CHECKING:
    from torch import nn

    from hyper_parallel.components.tokenizer._runtime import TokenizerRuntime

__all__ = [
    "GenerateError",
    "Loaded",
    "chat_prompt",
    "generate_text",
    "load_model",
    "main",
    "read_history",
]

#: Exit status of an input error (as every command of the project).
EXIT_INPUT_ERROR = 2


class GenerateError(ValueError):
    """A folder, file or option generation cannot use; the message is one line."""


class Loaded:
    """A model ready to decode: the module (eval mode), its tokenizer, and what was read (for stderr);
    ``image_pixels`` the ``(min_pixels, max_pixels)`` its images were resized within in training (the run's
    data, or an exported folder's preprocessor config), None when nothing says."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: TokenizerRuntime,
        max_length: int | None,
        what: str,
        image_pixels: tuple[int, int] | None = None,
    ):
        self.model, self.tokenizer, self.max_length, self.what = model, tokenizer, max_length, what
        self.image_pixels = image_pixels

    @property
    def sees_images(self) -> bool:
        """Whether the model takes images (a vision tower: ``pixel_values`` in its forward)."""
        import inspect

        return "pixel_values" in inspect.signature(self.model.forward).parameters


def load_model(
    path: str | Path,
    *,
    config: str | Path | None = None,
    device: str = "cpu",
    accept_changed_base: bool = False,
) -> Loaded:
    """The model and tokenizer of a checkpoint or an exported folder ``path`` (see the module docstring);
    ``accept_changed_base`` merges LoRA adapters into a base other than the one their ``base.json`` names."""
    from hyper_parallel._paths import entry_kinds
    from hyper_parallel.models import is_hf_folder

    folder = Path(path)
    if not folder.is_dir():
        raise GenerateError(f"{str(folder)!r}: no such folder")
    for problem in entry_kinds(folder):  # a FIFO among its files would be waited on
        raise GenerateError(problem)
    if is_hf_folder(folder):
        if config is not None:
            raise GenerateError(
                f"--config-file: {str(folder)!r} is a Hugging Face folder; its config.json is read"
            )
        return _load_hf_folder(folder, device)
    return _load_checkpoint(folder, config, device, accept_changed_base)


def _meta_model(spec: Any) -> nn.Module:
    model: nn.Module = spec.build_model_fn(spec.args, device="meta")
    return model


def _assign(model: nn.Module, weights: dict[str, Any], where: str, device: str) -> nn.Module:
    """Put ``weights`` (our names) into the meta ``model``; every parameter must be given (ties aside)."""
    import inspect

    parameters = inspect.signature(model.forward).parameters
    if "cache" not in parameters and "pixel_values" not in parameters:
        raise GenerateError(f"{where}: {type(model).__name__} cannot decode text (text models only)")
    try:
        result = model.load_state_dict(weights, strict=False, assign=True)
    except RuntimeError as exc:  # shapes of another model
        first = str(exc).strip().splitlines()[-1].strip()
        raise GenerateError(f"{where}: the weights do not match the model: {first}") from None
    tie = getattr(model, "tie_weights", None)
    if callable(tie):
        tie()
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    if result.unexpected_keys or missing:
        raise GenerateError(
            f"{where}: the weights do not match the model (missing {missing[:3]}, unexpected "
            f"{list(result.unexpected_keys)[:3]})"
        )
    try:
        return model.to(device).eval()
    except (RuntimeError, AssertionError) as exc:  # a device this machine has not ("not compiled with")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GenerateError(f"--device {device}: cannot be used here: {first}") from None


def _load_checkpoint(
    folder: Path, config: str | Path | None, device: str, accept_changed_base: bool
) -> Loaded:
    from hyper_parallel.components.dataloader import NoSource
    from hyper_parallel.export import ExportError, read_checkpoint

    try:
        step, cfg, weights = read_checkpoint(folder, config, accept_changed_base=accept_changed_base)
    except ExportError as exc:
        raise GenerateError(str(exc)) from None
    spec = cfg.model
    model = _assign(_meta_model(spec), weights, str(step), device)
    try:
        tokenizer = cfg.tokenizer.build(spec.weights_path)
    except (OSError, ValueError) as exc:
        raise GenerateError(f"{str(step)!r}: the run's tokenizer cannot be loaded: {exc}") from None
    what = f"{step} ({spec.name} {spec.flavor})"
    bounds = getattr(cfg.dataloader, "dataset", NoSource()).pixel_bounds()
    return Loaded(model, tokenizer, spec.args.max_sequence_length(), what, image_pixels=bounds)


def _load_hf_folder(folder: Path, device: str) -> Loaded:
    from hyper_parallel.components.tokenizer import HuggingFaceTokenizer
    from hyper_parallel.errors import InputFileError
    from hyper_parallel.models import check_tensors, hf_folder_spec, read_safetensors_folder

    config_file = folder / "config.json"
    try:
        spec = hf_folder_spec(folder)
    except ValueError as exc:
        raise GenerateError(str(exc)) from None
    _refuse_oversized(folder, config_file, spec)
    try:
        check_tensors(spec)  # the headers against the model: a tensor it lacks is refused, never read
    except InputFileError as exc:
        raise GenerateError(str(exc.issues[0])) from None
    try:
        weights = spec.state_dict_adapter(spec.args, str(folder)).from_hf(read_safetensors_folder(folder))
    except (OSError, KeyError, ValueError) as exc:
        raise GenerateError(f"{str(folder)!r}: the weights cannot be read: {exc}") from None
    model = _assign(_meta_model(spec), weights, str(folder), device)
    add_bos = True
    tokenizer_config = folder / "tokenizer_config.json"
    try:
        if tokenizer_config.is_file():
            saved = loads(tokenizer_config.read_text(encoding="utf-8"))
            add_bos = not isinstance(saved, dict) or saved.get("add_bos_token", True) is not False
        tokenizer = HuggingFaceTokenizer.Config(path=str(folder), add_bos=add_bos).build()
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise GenerateError(f"{str(folder)!r}: the tokenizer cannot be loaded: {exc}") from None
    what = f"{folder} ({spec.name} {spec.flavor})"
    return Loaded(model, tokenizer, spec.args.max_sequence_length(), what, image_pixels=_pixel_bounds(folder))


def _pixel_bounds(folder: Path) -> tuple[int, int] | None:
    """``(min_pixels, max_pixels)`` of the folder's ``preprocessor_config.json`` (export writes it for a
    vision-language model), or None without one."""
    from hyper_parallel.models.qwen3_5.images import MAX_PIXELS

    path = folder / "preprocessor_config.json"
    if not path.is_file():
        return None
    try:
        saved = loads(path.read_text(encoding="utf-8"))
        low, high = saved["min_pixels"], saved["max_pixels"]
        if not (type(low) is int and type(high) is int and 0 < low <= high <= MAX_PIXELS):
            raise ValueError(
                f"min_pixels {low!r} and max_pixels {high!r} are not integers with 0 < min <= max <= "
                f"{MAX_PIXELS} (the image processor's largest bound)"
            )
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError) as exc:
        detail = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
        raise GenerateError(f"{str(path)!r}: {detail}") from None
    return low, high


def _refuse_oversized(folder: Path, config_file: Path, spec: Any) -> None:
    """Refuse a ``config.json`` describing a model larger than the safetensors headers store.

    Read from the headers alone (bounded: ``read_header``), before the model is built: a
    ``num_hidden_layers`` of 100,000 would otherwise build for minutes and gigabytes.
    """
    from hyper_parallel.errors import InputFileError
    from hyper_parallel.models import folder_values, size_problem

    try:
        stored = folder_values(folder)
    except InputFileError as exc:
        raise GenerateError(str(exc.issues[0])) from None
    problem = size_problem(spec.args, stored)
    if problem is not None:
        raise GenerateError(f"{str(config_file)!r}: {problem}")


def generate_text(
    loaded: Loaded,
    prompt: str,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    image: str | None = None,
    chat: bool = False,
    system: str | None = None,
    history: Sequence[dict[str, str]] = (),
) -> str:
    """The continuation of ``prompt`` (text after it, without the end-of-sequence token); with ``image``,
    the assistant's answer to a user turn holding the image and ``prompt``; with ``chat``, the
    continuation of ``prompt`` as a user message (after ``system``'s and the earlier turns of ``history``)
    rendered by ``chat_prompt`` (the module docstring)."""
    from hyper_parallel.models import generate_ids

    tokenizer = loaded.tokenizer
    inputs: dict[str, Any] | None = None
    if image is not None:
        ids, inputs = _image_prompt(loaded, image, prompt, max_new_tokens)
    elif chat:
        ids = chat_prompt(tokenizer, prompt, system, history)
    else:
        ids = tokenizer.encode(prompt, add_eos=False)
    if not ids:
        raise GenerateError("--prompt: encodes to no tokens; give some text")
    _check_positions(loaded, len(ids), max_new_tokens)
    stop = () if tokenizer.eos_id is None else (tokenizer.eos_id,)
    new = generate_ids(
        loaded.model,
        ids,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        stop_ids=stop,
        vocab_size=tokenizer.vocab_size,
        use_cache=not loaded.sees_images,
        inputs=inputs,
    )
    if image is not None:  # the chat header before the answer is not part of the text printed
        if new and new[-1] in stop:
            new = new[:-1]
        return tokenizer.decode(new, skip_special_tokens=True)
    if new and new[-1] in stop:
        new = new[:-1]
    # Decoded together with the prompt, so a tokenizer that joins words (spaces, merged bytes) joins them
    # across the boundary as it would in one text; the prompt's own decoding is then cut off.
    head = tokenizer.decode(ids, skip_special_tokens=True)
    whole = tokenizer.decode(ids + new, skip_special_tokens=True)
    return whole[len(head) :] if whole.startswith(head) else tokenizer.decode(new, skip_special_tokens=True)


def chat_prompt(
    tokenizer: TokenizerRuntime,
    prompt: str,
    system: str | None = None,
    history: Sequence[dict[str, str]] = (),
) -> list[int]:
    """Ids of ``prompt`` as a user message (after ``system`` as a system message, when given, and the
    earlier turns of ``history``) and the assistant's header, rendered as training rendered conversations:
    the tokenizer's chat template (``tokenizer.chat_template``) with its generation prompt, else the
    built-in format."""
    from hyper_parallel.data.chat import ChatRenderer, builtin_chat

    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.extend(history)
    messages.append({"role": "user", "content": prompt})
    if tokenizer.chat_template is None:
        ids, _ = builtin_chat(tokenizer, messages)
        return ids + tokenizer.encode("<|assistant|>\n", add_bos=False, add_eos=False)
    try:
        text, _ = ChatRenderer(tokenizer).render(messages, add_generation_prompt=True)
    except ValueError as exc:
        raise GenerateError(f"--chat: {exc}") from None
    ((ids, _),) = tokenizer.encode_with_offsets([text])  # type: ignore[attr-defined]
    return list(ids)


def _check_positions(loaded: Loaded, prompt: int, max_new_tokens: int) -> None:
    """Refuse a prompt of ``prompt`` tokens that leaves no room for ``max_new_tokens`` in the model."""
    if loaded.max_length is not None and prompt + max_new_tokens > loaded.max_length:
        raise GenerateError(
            f"--max-new-tokens: the prompt's {prompt} tokens and {max_new_tokens} new ones exceed the "
            f"model's {loaded.max_length} positions"
        )


def _image_prompt(
    loaded: Loaded, image: str, prompt: str, max_new_tokens: int
) -> tuple[list[int], dict[str, Any]]:
    """Ids of a user turn holding ``image`` then ``prompt`` and the assistant's header, and the image's
    ``pixel_values`` and ``grid_thw``, prepared as ``image_chat`` training data is. The image's size comes
    from its header; the prompt's tokens are checked against the model's positions before a pixel is
    decoded (a small image resized up to large bounds would otherwise fill the memory first)."""
    import torch

    from hyper_parallel.data.chat import builtin_chat
    from hyper_parallel.errors import InputFileError
    from hyper_parallel.models.qwen3_5.images import MAX_PIXELS, MIN_PIXELS, Geometry, image_pixels, patchify

    args = getattr(loaded.model, "args", None)
    vision, image_token_id = getattr(args, "vision", None), getattr(args, "image_token_id", None)
    if not loaded.sees_images or vision is None or image_token_id is None:
        raise GenerateError(f"--image: {loaded.what} has no vision tower; give no --image")
    geometry = Geometry.of(vision, loaded.image_pixels or (MIN_PIXELS, MAX_PIXELS))
    try:
        size = geometry.fitted(Path(image), "--image")
    except InputFileError as exc:
        raise GenerateError(str(exc.issues[0])) from None
    turn = [{"role": "user", "content": [[image_token_id] * geometry.tokens(size), prompt]}]
    ids, _ = builtin_chat(loaded.tokenizer, turn)
    ids += loaded.tokenizer.encode("<|assistant|>\n", add_bos=False, add_eos=False)
    _check_positions(loaded, len(ids), max_new_tokens)
    try:
        pixels = image_pixels(Path(image), size)
    except InputFileError as exc:
        raise GenerateError(str(exc.issues[0])) from None
    patches = patchify(pixels, vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size)
    device = next(loaded.model.parameters()).device
    grid = torch.tensor([[1, size[1] // vision.patch_size, size[0] // vision.patch_size]])
    return ids, {"pixel_values": patches.to(device), "grid_thw": grid}


#: Largest ``--history`` file read: a conversation so far, not a dataset.
MAX_HISTORY_BYTES = 1 << 20


def read_history(path: str) -> list[dict[str, str]]:
    """The messages of the one chat record in the JSON file ``path`` (any shape ``prepare --format chat``
    reads), refused in one line (``GenerateError``) when the file is no regular file, over
    ``MAX_HISTORY_BYTES``, not JSON, or not a chat record."""
    from hyper_parallel._paths import read_regular
    from hyper_parallel.data.chat import conversation

    if not Path(path).is_file():
        raise GenerateError(f"{path}: no such file")
    try:
        data = read_regular(path, MAX_HISTORY_BYTES)  # opened without blocking, checked on the descriptor
    except ValueError:
        raise GenerateError(
            f"{path}: larger than {MAX_HISTORY_BYTES} bytes; a conversation so far is smaller"
        ) from None
    except OSError as exc:  # unreadable (permissions, an I/O error): one line, never a traceback
        raise GenerateError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        record = loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise GenerateError(f"{path}: not a JSON chat record ({exc})") from None
    if not isinstance(record, dict):
        raise GenerateError(f"{path}: not a JSON object (a chat record)")
    try:
        return conversation(record)
    except ValueError as exc:
        raise GenerateError(f"{path}: {exc}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hyper_parallel.generate",
        description="Continue a prompt with a checkpoint (a step-<N> folder, or checkpoint.folder for its "
        "newest step) or an exported Hugging Face folder; prints the prompt and its continuation.",
    )
    parser.add_argument("path", help="step-<N> folder, checkpoint.folder, or an exported folder")
    parser.add_argument("--prompt", required=True, help="text to continue (with --chat: the user's message)")
    parser.add_argument(
        "--chat",
        action="store_true",
        help="answer --prompt as a user message, rendered with the run's chat template",
    )
    parser.add_argument("--system", help="with --chat: a system message before the user's")
    parser.add_argument(
        "--history",
        metavar="FILE",
        help="with --chat: a JSON file of one chat record (messages, ShareGPT or Alpaca, as prepare reads "
        "them): the earlier turns of the conversation, before --prompt's",
    )
    parser.add_argument(
        "--image", help="an image the prompt asks about (a vision-language checkpoint; chat format)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64, help="most tokens to add (default 64)")
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="0 decodes greedily (default); above, sampling"
    )
    parser.add_argument("--top-p", type=float, default=1.0, help="sample from this top mass, in (0, 1]")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    parser.add_argument("--config-file", help="the run's config, when the checkpoint holds no config.yaml")
    parser.add_argument("--device", default="cpu", help="torch device to decode on (default cpu)")
    parser.add_argument(
        "--accept-changed-base",
        action="store_true",
        help="decode with LoRA adapters on model.weights_path even when it differs from the base they were "
        "trained on (base.json)",
    )
    return parser


#: The lowest temperature above 0 that sampling takes: below it ``logits / temperature`` leaves float32's
#: range (inf, then NaN probabilities), and the draw is the argmax anyway.
MIN_TEMPERATURE = 1e-3


def _check_options(args: argparse.Namespace) -> None:
    """Refuse what the options say before anything is loaded: each value's range, a prompt that is no
    UTF-8 text (bytes the shell passed undecoded), a device that holds no values."""
    if args.max_new_tokens < 1:
        raise GenerateError(f"--max-new-tokens: must be >= 1, got {args.max_new_tokens}")
    if not args.temperature >= 0:  # also NaN
        raise GenerateError(f"--temperature: must be >= 0, got {args.temperature}")
    if not (args.temperature == 0 or MIN_TEMPERATURE <= args.temperature < float("inf")):
        raise GenerateError(
            f"--temperature: must be 0 (greedy) or in [{MIN_TEMPERATURE}, inf), got {args.temperature}"
        )
    if not 0 < args.top_p <= 1:
        raise GenerateError(f"--top-p: must be in (0, 1], got {args.top_p}")
    if args.system is not None and not args.chat:
        raise GenerateError("--system: only read with --chat")
    if args.history is not None and not args.chat:
        raise GenerateError("--history: only read with --chat")
    if args.chat and args.image is not None:
        raise GenerateError("--chat: --image already asks in the chat format; leave --chat out")
    if not 0 <= args.seed < 2**63:
        raise GenerateError(f"--seed: must be in [0, 2**63), got {args.seed}")
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as exc:  # undecodable argv bytes arrive as lone surrogates
        byte = ord(args.prompt[exc.start]) & 0xFF
        raise GenerateError(f"--prompt: not UTF-8 text: byte 0x{byte:02x} at {exc.start}") from None
    import torch

    try:
        device = torch.device(args.device)
    except (RuntimeError, ValueError, TypeError):
        raise GenerateError(
            f"--device: {args.device!r} is not a torch device (e.g. cpu, cuda, cuda:1)"
        ) from None
    if device.type == "meta":
        raise GenerateError("--device: 'meta' holds no values to decode with; use cpu or an accelerator")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (0 generated, 2 an input error printed on one line)."""
    args = _parser().parse_args(argv)
    old_torch = torch_version_problem()
    if old_torch is not None:  # refused as the launch scripts refuse it, before torch is imported
        print(f"generate: {old_torch}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    try:
        _check_options(args)
        history = () if args.history is None else read_history(args.history)
        loaded = load_model(
            args.path,
            config=args.config_file,
            device=args.device,
            accept_changed_base=args.accept_changed_base,
        )
        print(f"generate: {loaded.what}", file=sys.stderr)
        text = generate_text(
            loaded,
            args.prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            image=args.image,
            chat=args.chat,
            system=args.system,
            history=history,
        )
        shown = args.prompt
        if args.chat:  # the conversation as the model read it: the rendered prompt, then its answer
            shown = loaded.tokenizer.decode(
                chat_prompt(loaded.tokenizer, args.prompt, args.system, history), skip_special_tokens=True
            )
    except GenerateError as exc:
        print(f"generate: {exc}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    sys.stdout.write(shown + text + "\n")
    return 0


if __name__ == "__main__":
    from hyper_parallel._cli import run

    run(main)
