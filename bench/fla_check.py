"""The device check of flash-linear-attention's Gated DeltaNet kernels at Qwen 3.5 0.8B's shape, as a
``bench gpu --check`` step (``--parts fla``).

On a Hopper GPU whose Triton fla refuses (issue #640), Qwen 3.5's key head size 128 selects the key tile the
bug leaves correct, and the model runs fla's kernels once they match our chunked kernel on the device
(``hyper_parallel.models.qwen3_5._gated_delta.CheckedFla``). This step shows that decision on the machine:
which kernel the layers get and the warnings they say, the relative difference of fla's output and of every
input's gradient from our kernel's (one row of 4,096 tokens, one document and two), against the bf16
tolerance, and forward + backward of both kernels at the layer's shape (``bench.gpu``'s kernel row). The
tokens/s it buys are the compiled Qwen 3.5 speed row's (target: ``QWEN_TOKENS_TARGET``).

``tiny`` (and any run without CUDA) compares our chunked kernel with the token loop in float32 on the
debug shape instead: the same comparison code, no fla.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

__all__ = ["QWEN_TOKENS_TARGET", "fla_check"]

#: Tokens/s of the compiled Qwen 3.5 0.8B run (``configs/qwen3_5_0_8b_gpu.yaml``) that issue 47 asks for on
#: an H200: three times the 18,015 measured with our chunked kernel.
QWEN_TOKENS_TARGET = 3 * 18_015
#: Largest relative difference of the tiny mode's comparison (float32: our chunked kernel and the token
#: loop differ by rounding only).
TINY_TOLERANCE = 1e-4


def fla_check(tiny: bool) -> dict[str, Any]:
    """The check's results as plain data (see the module docstring); ``ok`` says whether it passed."""
    import attrs
    import torch

    from bench.gpu import _kernel_row
    from bench.model_shapes import TINY_MODELS, qwen3_5_0_8b_overrides
    from hyper_parallel.models.qwen3_5 import _gated_delta
    from hyper_parallel.models.qwen3_5.args import QWEN3_5_FLAVORS

    cuda = torch.cuda.is_available() and not tiny
    device = torch.device("cuda" if cuda else "cpu")
    overrides = qwen3_5_0_8b_overrides() if cuda else TINY_MODELS["qwen3_5"][1]
    args = attrs.evolve(QWEN3_5_FLAVORS["debugmodel"], **overrides)
    d_k, d_v = args.linear_key_head_dim, args.linear_value_head_dim
    seq = 4096 if cuda else 48
    dtype = torch.bfloat16 if cuda else torch.float32
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "seq": seq,
        "key_head_dim": d_k,
        "key_tile": _gated_delta.fla_key_tile(d_k),
        "refusal": _gated_delta.fla_refusal() if cuda else None,
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = _gated_delta.fla_kernel(d_k) if cuda else None
        result["kernel"] = "none" if kernel is None else type(kernel).__name__
        query = torch.empty(1, seq, args.linear_num_key_heads, d_k, device=device, dtype=dtype)
        value = torch.empty(1, seq, args.linear_num_value_heads, d_v, device=device, dtype=dtype)
        candidate: Any = (
            functools.partial(_gated_delta._through_fla, kernel)
            if kernel is not None
            else _gated_delta.recurrent_gated_delta_rule
        )
        tolerance = _gated_delta.FLA_CHECK_TOLERANCE if cuda else TINY_TOLERANCE
        for packed in (False, True):
            label = "two_documents" if packed else "one_document"
            if cuda and kernel is None:
                result[f"{label}_problem"] = "fla's kernels do not serve here"
                continue
            inputs = _gated_delta.check_inputs(query, query, value, packed)
            try:
                errors = _gated_delta.kernel_disagreement(
                    _gated_delta.chunk_gated_delta_rule, candidate, inputs
                )
            except Exception as error:  # fla's refusal, a Triton error
                result[f"{label}_problem"] = (
                    f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"
                )
                continue
            result[f"{label}_errors"] = errors
            result[f"{label}_problem"] = _gated_delta.disagreement_problem(errors, tolerance)
        if isinstance(kernel, _gated_delta.CheckedFla):  # the model's own verdict, as a layer reaches it
            result["model_verdict"] = kernel.serves(query, query, value, packed=False)
        result.update(_kernel_row(overrides, seq, device, 5 if cuda else 1))
    result["warnings"] = [str(w.message) for w in caught]
    checked = result["one_document_problem"] is None and result["two_documents_problem"] is None
    faster = not cuda or (result["fla_ms"] is not None and result["fla_ms"] < result["chunked_ms"])
    result["ok"] = checked and faster and (not cuda or result.get("model_verdict", True))
    return result
