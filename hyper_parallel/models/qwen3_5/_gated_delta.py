"""The gated delta rule of Gated DeltaNet: chunked (training) and token-by-token (decoding, reference).

With a state ``S`` (d_k, d_v) per head, every token ``t`` does::

    S <- exp(g_t) S;  S <- S + beta_t k_t (v_t - S^T k_t)^T;  o_t = S^T q_t

after L2-normalising ``q_t`` and ``k_t`` and scaling ``q_t`` by ``1 / sqrt(d_k)``. The token loop
(:func:`recurrent_gated_delta_rule`) is exact but sequential; :func:`chunk_gated_delta_rule` computes the
same thing a chunk of ``C`` tokens at a time. Within a chunk, the corrections ``delta_t = beta_t (v_t -
S_{t-1}^T k_t)`` solve the unit lower-triangular system ``(I + A) delta = beta v - beta exp(gamma) k S_0``
(``gamma`` the cumulative log decay inside the chunk, ``A_tj = beta_t exp(gamma_t - gamma_j) k_t . k_j``
for ``j < t``: the WY / UT representation of the product of Householder-like updates), so one triangular
solve and a few matrix products replace ``C`` sequential steps; only the chunk-to-chunk state is carried
in a Python loop. :func:`gated_delta_rule` runs flash-linear-attention's fused kernels when its caller passes
them (a Gated DeltaNet layer looks them up once when it is built, :func:`fla_kernel`, and passes them where
the tensors live on an accelerator in 16 bits, :func:`fla_serves`; packed documents go as ``cu_seqlens``),
the chunked PyTorch path otherwise.

Packed sequences: ``resets`` (batch, seq) marks the first token of each document; the state is zeroed
before that token (exactly what the token loop does), inside and across chunks.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import re
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.nn.functional as F

from hyper_parallel.models._layers import rms_norm

__all__ = [
    "CheckedFla",
    "chunk_gated_delta_rule",
    "cu_seqlens_from_resets",
    "fla_kernel",
    "fla_key_tile",
    "fla_serves",
    "gated_delta_rule",
    "kernel_disagreement",
    "recurrent_gated_delta_rule",
]

#: Chunk length used when the caller does not choose one.
DEFAULT_CHUNK_SIZE = 64


def _unit(x: torch.Tensor, scale: float, eps: float = 1e-6) -> torch.Tensor:
    """``scale * x / sqrt(sum(x^2) + eps)`` over the last dimension (fp32), through the RMSNorm kernel.

    Qwen 3.5 L2-normalises q and k with ``eps`` inside the square root; RMSNorm divides by
    ``sqrt(mean(x^2) + eps / d) = sqrt(sum(x^2) + eps) / sqrt(d)``, hence the factor ``d^-1/2``.
    """
    d = x.shape[-1]
    unit: torch.Tensor = rms_norm(x.float(), None, eps / d) * (scale * d**-0.5)
    return unit


def _prepare(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, repeat: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 L2-normalised (and scaled) queries and keys, repeated to the value heads if ``repeat``."""
    q = _unit(query, query.shape[-1] ** -0.5)
    k = _unit(key, 1.0)
    groups = value.shape[2] // key.shape[2]
    if repeat and groups > 1:  # each query/key head serves `groups` consecutive value heads
        q, k = q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2)
    return q, k, value.float()


def recurrent_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    resets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule token by token, in fp32: the reference, and the decoding step.

    ``query``/``key`` (batch, seq, k_heads, d_k), ``value`` (batch, seq, v_heads, d_v) with ``k_heads``
    dividing ``v_heads``; ``log_decay`` and ``beta`` (batch, seq, v_heads); ``initial_state`` (batch,
    v_heads, d_k, d_v); ``resets`` (batch, seq) bool, True where the state restarts from zero. Returns the
    output (batch, seq, v_heads, d_v) in the value dtype and the final state (fp32).
    """
    q, k, v = _prepare(query, key, value)
    g, b = log_decay.float(), beta.float()
    batch, seq, heads, d_k = k.shape
    state = q.new_zeros(batch, heads, d_k, v.shape[-1]) if initial_state is None else initial_state.float()
    outputs = []
    for t in range(seq):
        if resets is not None:
            state = state * (~resets[:, t]).to(state.dtype)[:, None, None, None]
        state = state * g[:, t].exp()[..., None, None]
        k_t = k[:, t]
        predicted = torch.einsum("bhkv,bhk->bhv", state, k_t)
        delta = (v[:, t] - predicted) * b[:, t, :, None]
        state = state + k_t[..., :, None] * delta[..., None, :]
        outputs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t]))
    return torch.stack(outputs, dim=1).to(value.dtype), state


def _to_chunks(x: torch.Tensor, pad: int, chunk: int, groups: int = 1) -> torch.Tensor:
    """(batch, seq, heads, ...) -> (batch * heads * groups, n_chunks, chunk, ...), zero-padded at the end.

    ``groups > 1`` repeats every head that many times (in the same copy as the layout change).
    """
    x = x.movedim(2, 1)
    if groups > 1:
        x = x.repeat_interleave(groups, dim=1)
    if pad:
        x = F.pad(x, (0, 0) * (x.dim() - 3) + (0, pad))
    return x.reshape(x.shape[0] * x.shape[1], -1, chunk, *x.shape[3:])


def chunk_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    initial_state: torch.Tensor | None = None,
    resets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule a chunk at a time (same arguments and results as the recurrent form).

    The sequence is zero-padded to a multiple of ``chunk_size``; padded tokens have ``beta = 0`` and no
    decay, so they leave the state unchanged. Work is O(seq * chunk * d) in batched matrix products plus
    one ``(chunk, chunk)`` triangular solve per chunk; the Python loop runs ``seq / chunk`` times.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    batch, seq, heads, d_v = value.shape
    q, k, v = _prepare(query, key, value, repeat=False)
    d_k = k.shape[-1]
    chunk = chunk_size
    pad = -seq % chunk
    groups = heads // k.shape[2]
    q, k = _to_chunks(q, pad, chunk, groups), _to_chunks(k, pad, chunk, groups)  # (BH, N, C, d_k)
    v = _to_chunks(v, pad, chunk)
    g = _to_chunks(log_decay.float(), pad, chunk)  # (BH, N, C)
    b = _to_chunks(beta.float(), pad, chunk)
    n_chunks = g.shape[1]

    gamma = g.cumsum(-1)  # log decay from the chunk start to each token, inclusive
    future = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    if resets is None:
        blocked = future
        start_open: torch.Tensor | None = None  # every token sees the state of the previous chunk
        end_open: torch.Tensor | None = None
    else:
        # Document index of every token (padding joins the last document); tokens interact only
        # inside one document.
        doc = F.pad(resets.long(), (0, pad)).cumsum(1).reshape(batch, 1, n_chunks, chunk)
        doc = doc.expand(batch, heads, n_chunks, chunk).reshape(batch * heads, n_chunks, chunk)
        before = F.pad(doc[:, :-1, -1], (1, 0))  # document open when each chunk starts
        start_open = doc == before[..., None]  # no reset between the previous chunk and this token
        end_open = doc == doc[..., -1:]  # token belongs to the document that is open at the chunk end
        blocked = future | (doc[..., :, None] != doc[..., None, :])
    pair_decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(blocked, float("-inf")).exp()
    k_beta = k * b[..., None]
    from_start = gamma.exp()
    to_end = (gamma[..., -1:] - gamma).exp()
    if start_open is not None and end_open is not None:
        from_start = from_start * start_open
        to_end = to_end * end_open
    # (I + A) [U | W] = [beta v | beta exp(gamma) k]: delta = U - W S_0. The solver reads only the
    # strictly lower triangle of A (unit diagonal).
    system = (k_beta @ k.transpose(-1, -2)) * pair_decay
    rhs = torch.cat((v * b[..., None], k_beta * from_start[..., None]), dim=-1)
    if rhs.shape[-1] > chunk:  # wide heads: invert once, then one efficient batched product
        eye = torch.eye(chunk, dtype=rhs.dtype, device=rhs.device).expand_as(system)
        inverse = torch.linalg.solve_triangular(system, eye, upper=False, unitriangular=True)
        solved = inverse @ rhs
    else:
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u, w = solved[..., :d_v], solved[..., d_v:]
    k_end = (k * to_end[..., None]).transpose(-1, -2)  # (BH, N, d_k, C)
    state_decay = gamma[..., -1].exp()  # (BH, N)
    if start_open is not None:  # the last token sees the entering state only if no reset came between
        state_decay = state_decay * start_open[..., -1]
    state = (
        q.new_zeros(batch * heads, d_k, d_v)
        if initial_state is None
        else initial_state.float().reshape(batch * heads, d_k, d_v)
    )
    intra = (q @ k.transpose(-1, -2)) * pair_decay  # within-chunk attention, decay applied
    q_start = q * from_start[..., None]  # queries reading the state that entered the chunk
    # unbind, not indexing: one backward node per tensor instead of a zero-filled gradient per chunk.
    per_chunk = (u, w, k_end, state_decay, intra, q_start)
    steps = zip(*(x.unbind(1) for x in per_chunk), strict=True)
    outputs = []
    for u_n, w_n, k_end_n, decay_n, intra_n, q_n in steps:
        delta = torch.baddbmm(u_n, w_n, state, alpha=-1.0)
        outputs.append(torch.baddbmm(intra_n @ delta, q_n, state))
        state = torch.baddbmm(state * decay_n[:, None, None], k_end_n, delta)
    out = torch.stack(outputs, dim=1)  # (BH, N, C, d_v)
    out = out.reshape(batch, heads, -1, d_v)[:, :, :seq].transpose(1, 2)
    return out.to(value.dtype), state.reshape(batch, heads, d_k, d_v)


#: fla issue #640: Triton 3.4.0 up to (not including) 3.7.1 computes fla's gated backward wrongly on Hopper
#: (compute capability 9); fla 0.6 refuses it there (at the first backward) unless tilelang serves it.
_FLA_HOPPER_BAD_TRITON = ((3, 4, 0), (3, 7, 1))
#: The key tile fla's gated backward (``chunk_bwd_dqkwg``) uses on Hopper for the run's key head size that
#: #640 leaves correct: the miscompile corrupts dk and dg only with a 64-wide tile (32 and 128 test clean,
#: fla issue #640's bisection), and fla picks ``min(max(next_power_of_2(d_k), 16), 128)`` there.
FLA_SAFE_KEY_TILE = 128
#: Largest relative RMS difference ``||fla - ours|| / ||ours||`` of the output and of every input's gradient
#: that the device check accepts (see :func:`kernel_disagreement`).
FLA_CHECK_TOLERANCE = 0.04
#: The flag of fla's #640 refusal in ``fla.ops.common.chunk_o`` (fla 0.6) that the bypass reads as True.
_FLA_GUARD = "TRITON_ABOVE_3_7_1"


def fla_key_tile(key_head_dim: int) -> int:
    """The width of the key tile fla's gated backward takes on Hopper for ``key_head_dim``.

    fla 0.6 (``fla/ops/common/chunk_o.py``, ``chunk_bwd_dqkwg``): ``BK = min(max(next_power_of_2(K), 16),
    CONST_TILING)``, with ``CONST_TILING = 128`` on a device with Hopper's shared memory (every compute
    capability 9 part). Qwen 3.5's key head size 128 gives 128; 64 gives the tile #640 corrupts.
    """
    return min(max(1 << max(key_head_dim - 1, 0).bit_length(), 16), FLA_SAFE_KEY_TILE)


@functools.cache
def fla_kernel(key_head_dim: int = 0) -> Callable[..., Any] | None:
    """flash-linear-attention's fused chunked kernel for layers of ``key_head_dim``, looked up once per
    process and key head size; None where it is not installed or cannot train here.

    Where fla refuses only because of #640 (:func:`fla_refusal`) and ``key_head_dim`` selects the 128-wide
    key tile the bug leaves correct (:func:`fla_key_tile`), its kernels serve anyway, as a
    :class:`CheckedFla`: each call shape is first compared with our chunked kernel on the device, and the
    refusal is lifted through fla's public backend registry (:func:`_lift_fla_640_refusal`). A Gated
    DeltaNet layer calls this when it is built, outside any compiled block (dynamo cannot trace fla's
    import), and keeps the result.
    """
    try:
        module = importlib.import_module("fla.ops.gated_delta_rule")
    except ImportError:
        return None
    found: Callable[..., Any] | None = getattr(module, "chunk_gated_delta_rule", None)
    if found is None:
        return None
    # fla's autograd function and Triton launches run eagerly inside a compiled block (a graph break).
    kernel: Callable[..., Any] = torch.compiler.disable(found)  # type: ignore[no-untyped-call]
    refusal = fla_refusal()
    if refusal is None:
        return kernel
    why_not = _why_not_checked(refusal, key_head_dim)
    if why_not is not None:
        warnings.warn(f"{why_not}; Gated DeltaNet runs the PyTorch chunked kernel", stacklevel=2)
        return None
    return CheckedFla(kernel, refusal)


def _why_not_checked(refusal: str, key_head_dim: int) -> str | None:
    """Why fla's refused kernels cannot serve after a device check (None: they can): the key tile #640
    corrupts, or a refusal fla's registry cannot lift."""
    tile = fla_key_tile(key_head_dim)
    if tile != FLA_SAFE_KEY_TILE:
        return refusal
    lifted = _lift_fla_640_refusal()
    if lifted is not None:
        return f"{refusal}; its {tile}-wide key tile is not affected, but {lifted}"
    return None


@functools.cache
def _lift_fla_640_refusal() -> str | None:
    """Let fla's gated backward run where #640 refuses it, for key tiles of ``FLA_SAFE_KEY_TILE`` only;
    None when done, else why it cannot be.

    fla has no switch for this (0.6): ``chunk_bwd_dqkwg`` (``fla/ops/common/chunk_o.py``, dispatched
    through the ``common`` operation's backend registry) raises when its module's ``IS_NVIDIA_HOPPER and
    TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1``; no environment variable or argument skips it, and
    ``FLA_DISABLE_BACKEND_DISPATCH`` only removes the registry. What fla offers is that registry
    (``fla.backends.register``, as its tilelang backend uses for the same function): a backend registered
    here accepts the calls whose key tile is ``FLA_SAFE_KEY_TILE`` (its verifier; fla falls through to its
    own path, and its refusal, for the rest) and runs fla's own function with ``TRITON_ABOVE_3_7_1`` read as
    True for the length of that call. Nothing else of fla is replaced; the device check
    (:class:`CheckedFla`) decides whether the result is used.
    """
    try:
        backends = importlib.import_module("fla.backends")
        chunk_o = importlib.import_module("fla.ops.common.chunk_o")
    except ImportError as error:
        return f"fla's backend registry cannot be imported ({error})"
    guarded = getattr(chunk_o, "chunk_bwd_dqkwg", None)
    register = getattr(backends, "register", None)
    base = getattr(backends, "BaseBackend", None)
    if guarded is None or register is None or base is None or not hasattr(chunk_o, _FLA_GUARD):
        return "this fla's gated backward is not the one this bypass knows (fla 0.6's chunk_bwd_dqkwg)"
    own = inspect.unwrap(guarded)

    class _Hopper128KeyTile(base):  # type: ignore[misc, valid-type]
        backend_type = "hyper_parallel_640_128_key_tile"
        priority = 5

        def chunk_bwd_dqkwg_verifier(
            self, q: torch.Tensor, k: torch.Tensor, *args: Any, **kwargs: Any
        ) -> Any:
            if fla_key_tile(k.shape[-1]) != FLA_SAFE_KEY_TILE:
                return False, f"key tile {fla_key_tile(k.shape[-1])} wide: fla issue #640 applies"
            return True, None

        def chunk_bwd_dqkwg(self, *args: Any, **kwargs: Any) -> Any:
            saved = getattr(chunk_o, _FLA_GUARD)
            setattr(chunk_o, _FLA_GUARD, True)
            try:
                return own(*args, **kwargs)
            finally:
                setattr(chunk_o, _FLA_GUARD, saved)

    register("common")(_Hopper128KeyTile)
    return None


class CheckedFla:
    """fla's kernel where only #640 refuses it and the key tile is 128 wide: it serves a call shape only
    after a device comparison with our chunked kernel on that shape (:meth:`serves`, once per process per
    shape); a shape that fails falls back to our kernel, with the refusal's warning and the difference."""

    def __init__(self, kernel: Callable[..., Any], refusal: str) -> None:
        self.kernel = kernel
        self.refusal = refusal
        #: The verdict per call shape: None where fla's kernels matched ours, else what differed.
        self.verdicts: dict[tuple[Any, ...], str | None] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.kernel(*args, **kwargs)

    def serves(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, packed: bool) -> bool:
        """Whether fla serves a call of these shapes (batch aside), comparing the kernels the first time."""
        shape = (*query.shape[1:], value.shape[2], value.shape[3], query.dtype, query.device, packed)
        if shape not in self.verdicts:
            # In a thread of its own: the caller's grad mode, autocast and saved-tensor hooks (activation
            # checkpointing's) are thread-local and stay out of the comparison's forward and backward.
            with ThreadPoolExecutor(1, thread_name_prefix="fla-check") as pool:
                problem = pool.submit(self.compare, query, key, value, packed).result()
            self.verdicts[shape] = problem
            heads = f"{key.shape[2]}x{key.shape[3]} key, {value.shape[2]}x{value.shape[3]} value heads"
            where = f"{query.shape[1]} tokens{', packed' if packed else ''}, {heads}, {query.dtype}"
            if problem is None:
                warnings.warn(
                    f"{self.refusal}; key head size {key.shape[3]} takes the {FLA_SAFE_KEY_TILE}-wide key "
                    f"tile the bug leaves correct, and fla's forward and gradients matched the PyTorch "
                    f"chunked kernel on this device ({where}): Gated DeltaNet runs fla's kernels",
                    stacklevel=2,
                )
            else:
                warnings.warn(
                    f"{self.refusal}; fla's kernels differ from the PyTorch chunked kernel on this device "
                    f"({where}: {problem}); Gated DeltaNet runs the PyTorch chunked kernel",
                    stacklevel=2,
                )
        return self.verdicts[shape] is None

    def compare(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, packed: bool
    ) -> str | None:
        """fla against our chunked kernel on random inputs of one row of these shapes (two documents when
        ``packed``); None where every difference is within ``FLA_CHECK_TOLERANCE``, else what differed (a
        failing launch too: fla's own refusal, a Triton error)."""
        # A new thread starts on device 0: make the inputs' device current (fla launches there).
        current = torch.cuda.device(query.device) if query.device.type == "cuda" else contextlib.nullcontext()
        try:
            with current:
                inputs = check_inputs(query, key, value, packed)
                errors = kernel_disagreement(
                    chunk_gated_delta_rule, functools.partial(_through_fla, self.kernel), inputs
                )
        except Exception as error:  # fla refused or failed: our kernel serves
            return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"
        return disagreement_problem(errors, FLA_CHECK_TOLERANCE)


def check_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, packed: bool) -> dict[str, Any]:
    """Random inputs of the gated delta rule for one row of ``query``/``key``/``value``'s shapes, on their
    device and in their dtype (the log decay in float32, as the layers compute it), in the range a Qwen 3.5
    layer sees: unit-variance activations, decays ``exp(g)`` in (0.37, 1), ``beta`` in (0, 1); ``resets``
    makes two documents (a third of the row, then the rest) when ``packed``."""
    generator = torch.Generator(device=query.device).manual_seed(640)
    seq, device, dtype = query.shape[1], query.device, query.dtype

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device).to(dtype)

    heads = value.shape[2]
    inputs: dict[str, Any] = {
        "query": normal(1, seq, *query.shape[2:]),
        "key": normal(1, seq, *key.shape[2:]),
        "value": normal(1, seq, *value.shape[2:]),
        "log_decay": -torch.rand(1, seq, heads, generator=generator, device=device),
        "beta": torch.rand(1, seq, heads, generator=generator, device=device).to(dtype),
    }
    if packed:
        resets = torch.zeros(1, seq, dtype=torch.bool, device=device)
        resets[0, seq // 3] = True
        inputs["resets"] = resets
    return inputs


def kernel_disagreement(
    reference: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    candidate: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    inputs: dict[str, Any],
) -> dict[str, float]:
    """Relative RMS difference ``||candidate - reference|| / ||reference||`` of the output and of the
    gradient of every floating-point input (``query``, ``key``, ``value``, ``log_decay``, ``beta``), both
    kernels called as ``kernel(query, key, value, log_decay, beta, resets=...)`` on the same ``inputs``
    with the same random output gradient.

    The tolerance the device check applies (``FLA_CHECK_TOLERANCE``, 0.04) is bf16's, with margin. A bf16
    number keeps 8 significant bits, so each rounding moves a value by up to 2^-9 relative (RMS about
    2^-9 / sqrt(3) = 0.0011). fla rounds its intermediates to bf16 (the keys scaled by beta, the WY factors
    ``w`` and ``u``, the chunk states and their gradients: about five roundings on the way to any result)
    and accumulates its products in fp32 (over d_k = 128 and the 64-token chunk: fp32's 2^-24 times that,
    far below bf16's), while our kernel keeps fp32 throughout; independent roundings add in quadrature, so
    the output and dq, dk, dv should differ by about sqrt(5) x 0.0011 = 0.0025 (the state carried across
    chunks decays, ``exp(g) < 1``, rather than compounding it). The gradients of beta and of the log decay
    are sums over whole heads (d_k x d_v products per token, and a reverse cumulative sum over the chunk for
    the decay), where cancellation raises the relative error: fla's own tests bound these very quantities,
    in this measure and against an fp32 reference, at 0.005 (output), 0.008 (dq, dk, dv) and 0.02 (dbeta,
    dg). 0.04 is twice fla's loosest bound; #640's miscompile moves dk and dg by whole units (maximum
    errors of 14.65 and 5.47 against values of order one in the issue's bisection), far beyond it. A check
    that fails only costs speed: our kernel serves.
    """
    differentiable = [name for name, x in inputs.items() if x.is_floating_point()]
    grad: torch.Tensor | None = None
    results: dict[str, dict[str, torch.Tensor]] = {}
    for label, kernel in (("reference", reference), ("candidate", candidate)):
        given = {n: x.detach().clone().requires_grad_(n in differentiable) for n, x in inputs.items()}
        with torch.enable_grad():
            out, _ = kernel(
                *(given[n] for n in ("query", "key", "value", "log_decay", "beta")),
                resets=given.get("resets"),
            )
            if grad is None:
                generator = torch.Generator(device=out.device).manual_seed(641)
                grad = torch.randn(out.shape, generator=generator, device=out.device).to(out.dtype)
            grads = torch.autograd.grad(out, [given[n] for n in differentiable], grad)
        results[label] = {"output": out.detach(), **dict(zip(differentiable, grads, strict=True))}
    errors = {}
    for name, want in results["reference"].items():
        got = results["candidate"][name].float()
        scale = want.float().norm().clamp_min(torch.finfo(torch.float32).tiny)
        errors[name] = float((got - want.float()).norm() / scale)
    return errors


def disagreement_problem(errors: dict[str, float], tolerance: float) -> str | None:
    """None where every relative difference is within ``tolerance`` (a NaN never is), else which differ."""
    over = [f"{name} {error:.3g}" for name, error in errors.items() if not error <= tolerance]
    if not over:
        return None
    return f"relative RMS difference above {tolerance}: {', '.join(over)}"


def fla_refusal(
    capability: tuple[int, int] | None = None, triton_version: str | None = None, tilelang: bool | None = None
) -> str | None:
    """Why fla's kernels cannot train on this machine (this CUDA device and Triton), or None.

    The arguments default to what this machine has; tests give them.
    """
    if capability is None:
        if not torch.cuda.is_available():
            return None
        capability = torch.cuda.get_device_capability()
    if triton_version is None:
        try:
            triton_version = str(importlib.import_module("triton").__version__)
        except ImportError:
            return None
    if tilelang is None:
        tilelang = importlib.util.find_spec("tilelang") is not None
    found = tuple(int(part) for part in re.findall(r"\d+", triton_version)[:3])
    low, high = _FLA_HOPPER_BAD_TRITON
    if capability[0] == 9 and low <= found < high and not tilelang:
        return (
            f"flash-linear-attention's gated backward is wrong on Hopper GPUs with Triton {triton_version} "
            "(fla issue #640; Triton >= 3.7.1 or tilelang fixes it)"
        )
    return None


def cu_seqlens_from_resets(resets: torch.Tensor) -> torch.Tensor:
    """Document offsets (documents + 1,) int64 of the flattened batch: every row start and every reset.

    The variable-length form flash-linear-attention takes (``cu_seqlens``, batch 1); ``resets`` (batch,
    seq) is the per-token form our chunked kernel takes. Finding the starts syncs the host once.
    """
    batch, seq = resets.shape
    starts = resets.clone()
    starts[:, 0] = True
    offsets = starts.flatten().nonzero().squeeze(1)
    return torch.cat((offsets, offsets.new_tensor([batch * seq])))


@torch.compiler.disable  # the first call of a shape runs the device comparison: eager, once
def _checked_fla_serves(
    fla: CheckedFla, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, packed: bool
) -> bool:
    """:meth:`CheckedFla.serves`, outside any compiled block."""
    return fla.serves(query, key, value, packed)


def _through_fla(
    fla: Callable[..., Any],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    resets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule through fla's kernel ``fla``: key heads repeated to the value heads, packed
    documents as ``cu_seqlens`` of one flattened row, each row's final state picked from its last one."""
    groups = value.shape[2] // key.shape[2]
    if groups > 1:
        query, key = query.repeat_interleave(groups, dim=2), key.repeat_interleave(groups, dim=2)
    batch, seq = value.shape[:2]
    extra: dict[str, Any] = {}
    if resets is not None:  # one flattened row of documents
        cu_seqlens = cu_seqlens_from_resets(resets)
        query, key, value, log_decay, beta = (
            x.reshape(1, batch * seq, *x.shape[2:]) for x in (query, key, value, log_decay, beta)
        )
        extra["cu_seqlens"] = cu_seqlens
    out, state = fla(
        query,
        key.to(query.dtype),
        value.to(query.dtype),
        g=log_decay.float(),
        beta=beta.to(query.dtype),
        scale=query.shape[-1] ** -0.5,
        initial_state=initial_state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        **extra,
    )
    if resets is not None:  # each row's last document holds its final state
        row_ends = torch.arange(1, batch + 1, device=cu_seqlens.device) * seq
        ends = torch.searchsorted(cu_seqlens[1:], row_ends)
        out, state = out.reshape(batch, seq, *out.shape[2:]), state[ends]
    return out, state


def fla_serves(query: torch.Tensor) -> bool:
    """Whether fla's kernels serve a call on ``query``: an accelerator's, in 16 bits (they refuse float32)."""
    return query.device.type != "cpu" and query.dtype in (torch.bfloat16, torch.float16)


def gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    initial_state: torch.Tensor | None = None,
    resets: torch.Tensor | None = None,
    fla: Callable[..., Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over a sequence: output (batch, seq, v_heads, d_v) and final state.

    Single tokens (decoding) take the recurrent step; longer sequences the chunked algorithm, through
    ``fla`` when given (flash-linear-attention's kernel, :func:`fla_kernel`, passed where it serves the
    call, :func:`fla_serves`; a :class:`CheckedFla` only for shapes its device check passed; packed
    documents go to it as ``cu_seqlens`` over the flattened batch), else
    the PyTorch implementation here (which restarts the state at ``resets`` inside its chunks, with no host
    sync).
    """
    if query.shape[1] == 1:
        return recurrent_gated_delta_rule(
            query, key, value, log_decay, beta, initial_state=initial_state, resets=resets
        )
    # A CheckedFla (fla refused by #640 only) serves a shape once the device comparison has passed on it.
    serves = fla is not None and (resets is None or initial_state is None)
    if serves and isinstance(fla, CheckedFla):
        serves = _checked_fla_serves(fla, query, key, value, resets is not None)
    if serves and fla is not None:
        return _through_fla(
            fla, query, key, value, log_decay, beta, initial_state=initial_state, resets=resets
        )
    return chunk_gated_delta_rule(
        query,
        key,
        value,
        log_decay,
        beta,
        chunk_size=chunk_size,
        initial_state=initial_state,
        resets=resets,
    )
