"""Model runtime speed and memory: our Llama 3 and Qwen 3.5 modules against transformers' (same weights).

Run from the repository root (needs torch and transformers, the ``models-test`` extra)::

    python -m bench models [--quick] [--repeats N] [--threads N] [--clock wall|cpu] [--only TEXT]
                           [--no-memory] [--train-steps N] [--json PATH]

Every row builds our module, copies its weights into transformers' implementation of the same
architecture through the state-dict adapter (``to_hf``), checks that the logits agree, then times both
on one random batch (batch 1, fp32, CPU): ``fwd`` is a forward under ``torch.no_grad()``, ``fwd+bwd`` a
forward and the backward of the summed logits. The two implementations are timed alternately, round by
round (one warm-up round first), so that drift on a shared machine hits both alike; a row reports the
median of each and their ratio ``ours / transformers`` (below 1: ours is faster). ``gated delta rule``
rows time the Gated DeltaNet kernel alone (8 heads of 128 for keys and values), ours against
transformers' chunked PyTorch algorithm. ``MoE block`` rows time one Qwen 3.5 MoE feed-forward block
(router, grouped experts, gated shared expert; shape in ``MOE_SHAPE``) on hidden states, ours against
``Qwen3_5MoeSparseMoeBlock`` with the fastest of transformers' experts implementations on this machine
(``eager``, ``batched_mm``, ``grouped_mm``: each timed once, the fastest fwd+bwd kept; named in the row;
one more than twice as slow as the fastest at the shorter sequence is not tried again at the longer one).

The transformers path through the trainer (``bench.hf_path``): ``LLMTrainer`` training the debug shape as
``LlamaForCausalLM`` against the bare loop a transformers user writes, with and without document masking
(target: at least 0.97x its tokens per second), and the native Llama 3 against it; steps interleaved one by
one, ``--train-steps`` timed after 3 untimed.

Peak memory: each (model, implementation) runs one forward + backward at the longest sequence in a fresh
process; the figure is the rise of the resident set (``VmHWM`` after resetting it through
``/proc/self/clear_refs``) over the resident size before the step, with glibc serving every block above
64 KiB by ``mmap`` so that freed tensors leave the resident set. Linux only; skipped elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["main"]

#: (row name, model family, overrides of the debugmodel flavor).
MODELS: list[tuple[str, str, dict[str, Any]]] = [
    ("llama3 debug", "llama3", {}),
    ("qwen3.5 debug", "qwen3_5", {}),
    (
        "qwen3.5 128-wide DeltaNet heads",
        "qwen3_5",
        {"linear_key_head_dim": 128, "linear_value_head_dim": 128},
    ),
]
SEQS = (512, 2048)
KERNEL_SHAPE = {"heads": 8, "d_k": 128, "d_v": 128}
#: The MoE block of the ``MoE block`` rows: hidden size, experts, experts per token, their hidden sizes.
MOE_SHAPE = {"dim": 512, "experts": 32, "top_k": 4, "hidden": 256, "shared": 512}
#: transformers' experts implementations the ``MoE block`` rows choose the fastest of.
MOE_EXPERTS_IMPLEMENTATIONS = ("eager", "batched_mm", "grouped_mm")


def _pair(family: str, overrides: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Our module, transformers' module with the same weights, and the arguments (both in eval mode)."""
    import torch

    torch.manual_seed(0)
    if family == "llama3":
        import transformers

        from hyper_parallel.models import llama3
        from hyper_parallel.models.llama3._runtime import Llama3StateDictAdapter

        spec = llama3.create_model_spec("debugmodel", overrides=overrides or None)
        args = spec.args
        hf_config = {**Llama3StateDictAdapter(args).hf_config(), "tie_word_embeddings": False}
        config = transformers.LlamaConfig.from_dict(hf_config)
        theirs = transformers.LlamaForCausalLM(config)
        ours = spec.build_model_fn(args, device="cpu")
        theirs.load_state_dict(Llama3StateDictAdapter(args).to_hf(ours.state_dict()), strict=True)
    else:
        from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

        from hyper_parallel.models import qwen3_5
        from hyper_parallel.models.qwen3_5._runtime import Qwen3_5StateDictAdapter

        spec = qwen3_5.create_model_spec("debugmodel", overrides=overrides or None)
        args = spec.args
        config = Qwen3_5TextConfig(
            vocab_size=args.vocab_size,
            hidden_size=args.dim,
            intermediate_size=args.ffn_hidden_dim,
            num_hidden_layers=args.n_layers,
            num_attention_heads=args.n_heads,
            num_key_value_heads=args.n_kv_heads,
            head_dim=args.head_dim,
            linear_num_key_heads=args.linear_num_key_heads,
            linear_num_value_heads=args.linear_num_value_heads,
            linear_key_head_dim=args.linear_key_head_dim,
            linear_value_head_dim=args.linear_value_head_dim,
            linear_conv_kernel_dim=args.linear_conv_kernel_dim,
            rms_norm_eps=args.norm_eps,
            max_position_embeddings=args.max_seq_len,
            layer_types=list(args.layer_types()),
            rope_parameters={
                "rope_type": "default",
                "rope_theta": args.rope_theta,
                "partial_rotary_factor": args.partial_rotary_factor,
            },
            tie_word_embeddings=args.tie_word_embeddings,
        )
        theirs = Qwen3_5ForCausalLM(config)
        ours = spec.build_model_fn(args, device="cpu")
        with torch.no_grad():  # random norm weights, so that the comparison is not against zeros
            for name, param in ours.named_parameters():
                if name.endswith("norm.weight"):
                    param.uniform_(-0.5, 0.5)
        theirs.load_state_dict(Qwen3_5StateDictAdapter(args).to_hf(ours.state_dict()), strict=True)
    return ours.eval(), theirs.eval(), args


def _logits(model: Any, tokens: Any) -> Any:
    out = model(tokens)
    return out if not hasattr(out, "logits") else out.logits


def _steps(model: Any, tokens: Any) -> dict[str, Callable[[], None]]:
    import torch

    def forward() -> None:
        with torch.no_grad():
            _logits(model, tokens)

    def forward_backward() -> None:
        _logits(model, tokens).sum().backward()
        model.zero_grad(set_to_none=True)

    return {"fwd": forward, "fwd+bwd": forward_backward}


def _kernel_steps(seq: int) -> tuple[dict[str, Callable[[], None]], dict[str, Callable[[], None]], float]:
    """fwd and fwd+bwd of our gated delta rule and of transformers' chunked one; their max difference."""
    import torch
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    from hyper_parallel.models.qwen3_5._gated_delta import chunk_gated_delta_rule

    generator = torch.Generator().manual_seed(0)
    h, d_k, d_v = KERNEL_SHAPE["heads"], KERNEL_SHAPE["d_k"], KERNEL_SHAPE["d_v"]
    tensors = [
        torch.randn(1, seq, h, d_k, generator=generator),
        torch.randn(1, seq, h, d_k, generator=generator),
        torch.randn(1, seq, h, d_v, generator=generator),
        -torch.rand(1, seq, h, generator=generator),
        torch.rand(1, seq, h, generator=generator),
    ]
    for t in tensors:
        t.requires_grad_(True)

    def ours() -> Any:
        return chunk_gated_delta_rule(*tensors)[0]

    def theirs() -> Any:
        return torch_chunk_gated_delta_rule(*tensors, use_qk_l2norm_in_kernel=True)[0]

    with torch.no_grad():
        diff = float((ours() - theirs()).abs().max())

    def make(fn: Callable[[], Any]) -> dict[str, Callable[[], None]]:
        def forward() -> None:
            with torch.no_grad():
                fn()

        def forward_backward() -> None:
            fn().sum().backward()
            for t in tensors:
                t.grad = None

        return {"fwd": forward, "fwd+bwd": forward_backward}

    return make(ours), make(theirs), diff


def _moe_blocks(implementation: str) -> tuple[Any, Any]:
    """Our MoE block and transformers' with the same weights (``implementation`` of its experts)."""
    import torch
    from transformers.models.qwen3_5_moe import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock

    from hyper_parallel.models import qwen3_5_moe
    from hyper_parallel.models.qwen3_5_moe._modules import MoE

    shape = MOE_SHAPE
    overrides = {
        "dim": shape["dim"],
        "n_experts": shape["experts"],
        "n_experts_per_token": shape["top_k"],
        "ffn_hidden_dim": shape["hidden"],
        "shared_expert_hidden_dim": shape["shared"],
    }
    args = qwen3_5_moe.create_model_spec("debugmodel", overrides=overrides).args
    torch.manual_seed(0)
    ours = MoE(args)
    for weight in (ours.experts.w13, ours.experts.w2):
        torch.nn.init.normal_(weight, std=0.02)
    config = Qwen3_5MoeTextConfig(
        hidden_size=args.dim,
        num_experts=args.n_experts,
        num_experts_per_tok=args.n_experts_per_token,
        moe_intermediate_size=args.ffn_hidden_dim,
        shared_expert_intermediate_size=args.shared_expert_hidden_dim,
    )
    config._experts_implementation = implementation
    theirs = Qwen3_5MoeSparseMoeBlock(config)
    with torch.no_grad():
        theirs.gate.weight.copy_(ours.router.weight)
        theirs.experts.gate_up_proj.copy_(ours.experts.w13)
        theirs.experts.down_proj.copy_(ours.experts.w2)
        theirs.shared_expert.gate_proj.weight.copy_(ours.shared_expert.w1.weight)
        theirs.shared_expert.up_proj.weight.copy_(ours.shared_expert.w3.weight)
        theirs.shared_expert.down_proj.weight.copy_(ours.shared_expert.w2.weight)
        theirs.shared_expert_gate.weight.copy_(ours.shared_expert_gate.weight)
    return ours, theirs


def _moe_steps(
    seq: int, clock: Callable[[], float], candidates: list[str]
) -> tuple[dict[str, Callable[[], None]], dict[str, Callable[[], None]], float, dict[str, float]]:
    """fwd and fwd+bwd of our MoE block and transformers' fastest of ``candidates`` (the first of the
    returned timings); their difference; one fwd+bwd (seconds) of each candidate that runs, fastest first."""
    import torch

    x = torch.randn(1, seq, MOE_SHAPE["dim"], generator=torch.Generator().manual_seed(0), requires_grad=True)

    def make(block: Any) -> dict[str, Callable[[], None]]:
        def forward() -> None:
            with torch.no_grad():
                block(x)

        def forward_backward() -> None:
            block(x).sum().backward()
            block.zero_grad(set_to_none=True)
            x.grad = None

        return {"fwd": forward, "fwd+bwd": forward_backward}

    timings: dict[str, float] = {}
    best: Any = None
    ours: Any = None
    for implementation in candidates:
        try:
            ours, theirs = _moe_blocks(implementation)
            step = make(theirs)["fwd+bwd"]
            step()  # warm-up
            start = clock()
            step()
            timings[implementation] = clock() - start
        except Exception:  # not available with this torch/transformers: skip it
            continue
        if min(timings, key=timings.__getitem__) == implementation:
            best = theirs
        del theirs, step
    assert best is not None
    assert ours is not None
    with torch.no_grad():
        diff = float((ours(x) - best(x)).abs().max())
    ranked = dict(sorted(timings.items(), key=lambda item: item[1]))
    return make(ours), make(best), diff, ranked


def _time_pair(
    ours: Callable[[], None], theirs: Callable[[], None], repeats: int, clock: Callable[[], float]
) -> tuple[float, float]:
    """Medians (seconds) of ``repeats`` alternating runs of both, after one warm-up of each."""
    ours()
    theirs()
    samples: dict[str, list[float]] = {"ours": [], "theirs": []}
    for round_ in range(repeats):
        order = [("ours", ours), ("theirs", theirs)]
        for name, fn in order if round_ % 2 == 0 else order[::-1]:
            start = clock()
            fn()
            samples[name].append(clock() - start)
    return statistics.median(samples["ours"]), statistics.median(samples["theirs"])


def _speed_rows(
    repeats: int, seqs: tuple[int, ...], clock: Callable[[], float], only: str
) -> list[dict[str, Any]]:
    import torch

    rows: list[dict[str, Any]] = []
    for name, family, overrides in MODELS:
        if only not in name:
            continue
        ours, theirs, args = _pair(family, overrides)
        for seq in seqs:
            tokens = torch.randint(0, args.vocab_size, (1, seq), generator=torch.Generator().manual_seed(1))
            with torch.no_grad():
                diff = float((_logits(ours, tokens) - _logits(theirs, tokens)).abs().max())
            our_steps, their_steps = _steps(ours, tokens), _steps(theirs, tokens)
            for mode in our_steps:
                t_ours, t_theirs = _time_pair(our_steps[mode], their_steps[mode], repeats, clock)
                rows.append(_row(name, seq, mode, t_ours, t_theirs, diff))
                print(_format_row(rows[-1]), flush=True)
    candidates = list(MOE_EXPERTS_IMPLEMENTATIONS)
    for seq in seqs:
        if only not in "MoE block":
            continue
        our_steps, their_steps, diff, timings = _moe_steps(seq, clock, candidates)
        implementation, fastest = next(iter(timings.items()))
        # each implementation's cost grows linearly with the tokens: one more than twice as slow as the
        # fastest here is not tried at the longer sequences (batched_mm's per-token copies of the expert
        # weights would take ~17 GB of memory and ~25 s per step at 2048 tokens)
        candidates = [name for name, elapsed in timings.items() if elapsed <= 2 * fastest]
        for mode in our_steps:
            t_ours, t_theirs = _time_pair(our_steps[mode], their_steps[mode], repeats, clock)
            rows.append(_row(f"MoE block (vs {implementation})", seq, mode, t_ours, t_theirs, diff))
            print(_format_row(rows[-1]), flush=True)
    for seq in seqs:
        if only not in "gated delta rule":
            continue
        our_steps, their_steps, diff = _kernel_steps(seq)
        for mode in our_steps:
            t_ours, t_theirs = _time_pair(our_steps[mode], their_steps[mode], repeats, clock)
            rows.append(_row("gated delta rule (8x128)", seq, mode, t_ours, t_theirs, diff))
            print(_format_row(rows[-1]), flush=True)
    return rows


def _row(name: str, seq: int, mode: str, ours: float, theirs: float, diff: float) -> dict[str, Any]:
    return {
        "name": name,
        "seq": seq,
        "mode": mode,
        "ours_ms": ours * 1e3,
        "transformers_ms": theirs * 1e3,
        "ratio": ours / theirs,
        "max_abs_diff": diff,
    }


def _format_row(row: dict[str, Any]) -> str:
    return (
        f"| {row['name']:<32} | {row['seq']:>5} | {row['mode']:<7} | {row['ours_ms']:>9.1f} "
        f"| {row['transformers_ms']:>9.1f} | {row['ratio']:>5.2f}x | {row['max_abs_diff']:.1e} |"
    )


_HEADER = (
    "| model                            |   seq | step    |   ours ms | transf ms | ratio | max diff |\n"
    "|----------------------------------|------:|---------|----------:|----------:|------:|---------:|"
)


def _peak_memory_child(name: str, which: str, seq: int) -> None:
    """Print the resident-set rise (bytes) of one forward + backward (run in a fresh process)."""
    import torch

    family, overrides = next((f, o) for n, f, o in MODELS if n == name)
    ours, theirs, args = _pair(family, overrides)
    model = ours if which == "ours" else theirs
    del ours, theirs
    model.train()
    tokens = torch.randint(0, args.vocab_size, (1, seq), generator=torch.Generator().manual_seed(1))
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS")
    _logits(model, tokens).sum().backward()
    print((_status_kib("VmHWM") - before) * 1024)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _memory_rows(seq: int, threads: int, only: str) -> list[dict[str, Any]]:
    if platform.system() != "Linux":
        print("peak memory: skipped (needs Linux /proc)")
        return []
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    rows = []
    for name, _, _ in MODELS:
        if only not in name:
            continue
        peaks = {}
        for which in ("ours", "theirs"):
            command = [sys.executable, "-m", "bench.models", "--_peak", name, which, str(seq)]
            command += ["--threads", str(threads)]
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True, timeout=600)
            peaks[which] = int(done.stdout.strip().splitlines()[-1])
        row = {
            "name": name,
            "seq": seq,
            "ours_mib": peaks["ours"] / 2**20,
            "transformers_mib": peaks["theirs"] / 2**20,
            "ratio": peaks["ours"] / peaks["theirs"],
        }
        rows.append(row)
        print(
            f"| {name:<32} | {seq:>5} | {row['ours_mib']:>9.1f} | {row['transformers_mib']:>9.1f} "
            f"| {row['ratio']:>5.2f}x |",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench models", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 timed rounds per row instead of 7")
    parser.add_argument("--repeats", type=int, default=0, help="timed rounds per row (overrides --quick)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's)")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: elapsed time; cpu: process CPU time (steadier on a busy machine)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory rows")
    parser.add_argument(
        "--train-steps", type=int, default=0, help="timed steps of each trainer row (default 10; --quick: 5)"
    )
    parser.add_argument("--only", default="", help="only the rows whose name contains this text")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--_peak", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args._peak:
        name, which, seq = args._peak
        _peak_memory_child(name, which, int(seq))
        return 0
    import transformers

    from bench import hf_path

    repeats = args.repeats or (3 if args.quick else 7)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} "
        f"threads, fp32, batch 1, {args.clock} clock, median of {repeats} interleaved rounds"
    )
    print(_HEADER, flush=True)
    results: dict[str, Any] = {"speed": _speed_rows(repeats, SEQS, clock, args.only)}
    ratios = [row["ratio"] for row in results["speed"]]
    if any(args.only in name for name in hf_path.ROWS):
        steps = args.train_steps or (5 if args.quick else 10)
        print(f"\n{hf_path.TITLE}, {steps} timed steps after 3 (interleaved)")
        print(hf_path.HEADER, flush=True)
        results["trainer"] = hf_path.trainer_rows(steps, 3, torch.get_num_threads(), clock, args.only)
    if not args.no_memory:
        print(f"\npeak memory of forward + backward, seq {SEQS[-1]} (resident-set rise)")
        print("| model                            |   seq |  ours MiB | trans MiB | ratio |")
        print("|----------------------------------|------:|----------:|----------:|------:|", flush=True)
        results["memory"] = _memory_rows(SEQS[-1], torch.get_num_threads(), args.only)
        ratios += [row["ratio"] for row in results["memory"]]
    if ratios:
        print(f"\nworst ratio ours / transformers: {max(ratios):.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
