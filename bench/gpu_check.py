"""``python -m bench gpu --check``: every device check of the project, in one call (aimed at under 8 minutes).

What it runs, each step a fresh process of the real command line, results in one table and one JSON file:

1. ``tests``: the suite's ``cuda``-marked tests (``tests/models/test_cuda_paths.py``; they skip without
   CUDA).
2. ``debug``: each debug config (``llama3``, ``qwen3_5``, ``qwen3_5_moe``, ``qwen3_5_vl``) trained through
   ``python -m hyper_parallel.train_lm`` / ``train_vl`` with document masking on, in bf16 and in fp32 on
   the same device; the bf16 losses must stay within ``BF16_TOLERANCE`` of the fp32 ones over the first
   half of the logged steps, and within ``BF16_DRIFT`` at every one. bf16 keeps 8 bits of mantissa (a
   relative rounding of 2^-9 per operation); over the first steps the two runs differ by parts in a
   thousand of the loss, while a wrong kernel (a leaked document, a broken mask, a wrong cast) moves it by
   whole percents from the first step: 3% separates the two. Later, a recipe that memorises its data at a
   high learning rate amplifies any rounding: the VL debug recipe's bf16 run ends 14% from fp32 on an H200
   and 10% on a CPU, and its fp32 runs on the CPU and the H200 differ by 5.6% at step 8, so the later
   steps are held only to ``BF16_DRIFT``. The fp32 run saves checkpoints (its last step a full one); its
   relaunch must resume that step (the ``resumed`` record), and ``python -m hyper_parallel.generate``
   continues a prompt from it on the device.
3. ``speed``: the shipped GPU configs (``configs/llama3_2_1b_gpu.yaml``, ``configs/qwen3_5_0_8b_gpu.yaml``)
   trained by the real trainer with and without ``--compile.enable true``: tokens/s, MFU and peak memory as
   the trainer's metrics record them (the last logged step), beside the preflight's memory estimate. Each
   setting also trains both configs on real text, packed, document masking on (rows ``CONFIG packed``):
   the standard library's source files (``bench.packed_text`` says which and why) prepared once per check
   into ``OUT/packed-text`` by ``python -m hyper_parallel.data prepare``, the same figures plus the data
   (kind, documents, mean length) and the trainer's ``documents_per_row``; such a row fails unless each
   file became one document and rows held more than one (the synthetic rows hold one, plain causal).
4. ``peers``: our trainer's step, transformers' (tied, eager and compiled), Liger's (where its wheel is
   installed) and TorchTitan's own ``Trainer.train_step`` on the Llama 3.2-1B shape and batch, timed by one
   harness (:mod:`bench.peers.harness`: the same loop, dtype and compile setting; the median and spread of
   10 timed steps after warm-up). Wheels carried in ``wheels/`` (``bench/peers/README.md``) are installed
   for it first where TorchTitan is not importable. Two rows hold the transformers path to issue 45 item
   7: ``ours_hf`` is our trainer's ``train_step`` on the same config with the model section replaced by
   ``hyper_parallel.models.hf.create_model_spec`` over a ``config.json`` folder of ``LlamaForCausalLM`` at
   that shape (tied, ``init: random``), ``hf_loop`` a bare loop over the same folder's model with the
   trainer's wrapping at this world size (none on one device: autocast over float32 parameters), optimizer,
   schedule, clipping and batches. The ``ours_hf`` row reports ``trainer_vs_bare_loop`` (its tokens/s over
   ``hf_loop``'s; it fails below ``bench.hf_path.TARGET``, 0.97) and ``native_vs_hf_path`` (``ours``' over
   its own; it fails at 1 or below), eager and compiled; the tiny mode reports them without holding them.
5. ``attention``: one attention layer at the 1B shape and 4,096 tokens, forward + backward, document
   masking as the trainer runs it (one, two, one long and a few short, and many documents per row) against
   plain causal SDPA, and for the long-and-short rows each kernel that can serve them side by side:
   torch's ``varlen_attn`` (eager and in a ``fullgraph`` compiled function), FlexAttention's block mask
   and one causal call per document (:func:`attention_times`).
6. ``fla``: flash-linear-attention's Gated DeltaNet kernels at Qwen 3.5 0.8B's shape: which kernel the
   layers get on this machine (fla's, fla's after the device check where only fla issue #640 refuses it
   and the 128-wide key tile is taken, or our chunked one), fla's output and input gradients against our
   kernel's, and both kernels' forward + backward (:func:`bench.fla_check.fla_check`).
7. ``finetune``: full fine-tuning, LoRA (float32 and bfloat16 base) and QLoRA (with and without NF4
   embeddings) of the Llama 3.2-1B GPU config through the trainer (eager): tokens/s, each step against the
   full one, peak memory beside the preflight's; then QLoRA of the Qwen 3.5 debug config in bf16, its peak
   beside the preflight's.

Steps 1 and 2 run side by side (small, untimed), then 5, 6, the eager runs of 3, 4, the compiled runs
of 3 and 7 one at a time (``--parts`` runs some of them). ``--budget SECONDS`` (default 450) bounds the whole
check: each step's timeout is cut to what is left, and a step that cannot start in time is a failed row
that says so; ``check.json`` is rewritten after every step, so a lease that ends early keeps what ran.

``--tiny`` runs the same code on the CPU in tiny shapes (one debug config, two steps, small overrides of
the GPU configs, packed rows of 512 tokens, the peers' eager rows, no compile) so the suite can run it;
``--out DIR`` (default ``$OUT`` or ``bench-gpu-check``) receives ``check.json`` and every run's metrics.
Exit status 1 if any step failed.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import packed_text
from bench.model_shapes import TINY_MODELS
from hyper_parallel.preflight.flops import CONVENTION

__all__ = ["BF16_DRIFT", "BF16_TOLERANCE", "attention_times", "main", "median_ms"]

ROOT = Path(__file__).resolve().parents[1]
#: Largest relative difference of a bf16 loss from the fp32 one over the first half of the logged steps.
BF16_TOLERANCE = 0.03
#: Largest relative difference of any logged bf16 loss from the fp32 one (see the module docstring).
BF16_DRIFT = 0.2
#: Largest ratio of document-masked attention (any of the check's layouts) to plain causal attention on CUDA.
ATTENTION_TOLERANCE = 1.2
#: Seconds the whole check may take (the device lease's one call, less start-up and transfers).
DEFAULT_BUDGET = 450.0
DEBUG_CONFIGS = ("llama3", "qwen3_5", "qwen3_5_moe", "qwen3_5_vl")
GPU_CONFIGS = ("llama3_2_1b_gpu", "qwen3_5_0_8b_gpu")
#: The GPU configs' shapes in the tiny mode (model overrides; ``bench gpu``'s tiny Qwen), so a CPU runs
#: them in seconds.
TINY_OVERRIDES = {
    "llama3_2_1b_gpu": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512},
    "qwen3_5_0_8b_gpu": TINY_MODELS["qwen3_5"][1],
}


class Deadline:
    """The check's time budget: every step's timeout is cut to what is left of it (less a reserve for
    writing the results), and a step that cannot start in time is reported as skipped."""

    def __init__(self, seconds: float) -> None:
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()

    def cap(self, timeout: float) -> float:
        return max(0.0, min(timeout, self.left() - RESERVE))


#: Seconds of the budget kept for writing the results after the last step.
RESERVE = 5.0
#: Set by :func:`check`; every subprocess's timeout is cut to it.
_DEADLINE = Deadline(float("inf"))


def _run(command: list[str], timeout: float, log: Path) -> tuple[int, float]:
    """Run ``command`` from the repository root (this checkout first on the path); exit status, seconds.

    124 (as ``timeout`` reports it) when it ran past ``timeout`` or the check's budget, without being
    started when nothing of the budget is left.
    """
    timeout = _DEADLINE.cap(timeout)
    if timeout < 1:
        log.write_text("skipped: the check's time budget was spent\n", encoding="utf-8")
        return 124, 0.0
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as out:
        try:
            status = subprocess.run(
                command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            status = 124
    return status, time.perf_counter() - started


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _losses(path: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in _records(path) if "loss" in r}


def _launcher(name: str) -> str:
    return "hyper_parallel.train_vl" if "_vl" in name else "hyper_parallel.train_lm"


def _train(
    config: str, out: Path, tag: str, overrides: dict[str, Any], timeout: float
) -> tuple[int, float, Path, Path]:
    metrics = out / f"{tag}.jsonl"
    metrics.unlink(missing_ok=True)
    command = [sys.executable, "-m", _launcher(config), "--config-file", f"configs/{config}.yaml"]
    settings = {"metrics.enable_jsonl": "true", "metrics.jsonl_path": str(metrics), **overrides}
    for key, value in settings.items():
        command += [f"--{key}", str(value)]
    log = out / f"{tag}.log"
    status, seconds = _run(command, timeout, log)
    return status, seconds, metrics, log


def _debug_rows(out: Path, tiny: bool, device: str) -> list[dict[str, Any]]:
    """bf16 against fp32, then save, resume and generate, for each debug config (each config's runs in
    order, the configs side by side: they are small, and the device and cores are many)."""
    names = DEBUG_CONFIGS[:1] if tiny else DEBUG_CONFIGS
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        return list(pool.map(lambda name: _debug_row(out, tiny, device, name), names))


def _debug_row(out: Path, tiny: bool, device: str, name: str) -> dict[str, Any]:
    steps = 2 if tiny else 10
    config = f"{name}_debug"
    base: dict[str, Any] = {
        "training.max_steps": steps,
        "metrics.log_freq": 1,
        "dataloader.dataset.document_masking": "true",
    }
    if tiny:  # random tokens: no corpus to tokenise in every process
        base.update(
            {
                "training.seq_len": 64,
                "dataloader.dataset.source": "synthetic",
                "lr_scheduler.warmup_steps": 1,
            }
        )
    row: dict[str, Any] = {"step": "debug", "config": config, "ok": True, "notes": []}
    # The fp32 run saves checkpoints too (its last step a full one), which the relaunch resumes.
    folder = out / f"{config}-ckpt"
    shutil.rmtree(folder, ignore_errors=True)  # a folder of an earlier check would be resumed
    saving = {
        "checkpoint.enable": "true",
        "checkpoint.folder": str(folder),
        "checkpoint.last_save_model_only": "false",
        "checkpoint.interval": max(1, steps // 2),
    }
    losses = {}
    for dtype in ("float32", "bfloat16"):
        settings = {
            **base,
            "training.mixed_precision_param": dtype,
            **(saving if dtype == "float32" else {}),
        }
        status, seconds, metrics, log = _train(config, out, f"{config}-{dtype}", settings, 240)
        losses[dtype] = _losses(metrics)
        row[f"{dtype}_seconds"] = round(seconds, 1)
        if status != 0 or not losses[dtype]:
            row["ok"] = False
            row["notes"].append(f"{dtype} run exited {status} (see {log.name})")
    if row["ok"]:
        fp32 = sorted(losses["float32"].items())
        gaps = [abs(losses["bfloat16"][s] - loss) / abs(loss) for s, loss in fp32]
        early, worst = max(gaps[: max(1, len(gaps) // 2)]), max(gaps)
        row["bf16_vs_fp32_max_rel"], row["bf16_vs_fp32_early_max_rel"] = worst, early
        if early > BF16_TOLERANCE:
            row["ok"] = False
            row["notes"].append(
                f"bf16 loss {early:.1%} from fp32 in the first half (tolerance {BF16_TOLERANCE:.0%})"
            )
        if worst > BF16_DRIFT:
            row["ok"] = False
            row["notes"].append(f"bf16 loss {worst:.1%} from fp32 (tolerance {BF16_DRIFT:.0%})")
    saving = {**base, "training.mixed_precision_param": "float32", **saving}
    status, _, resume_metrics, log = _train(
        config, out, f"{config}-resume", {**saving, "training.max_steps": steps + 1}, 240
    )
    resumed = [r["step"] for r in _records(resume_metrics) if r.get("event") == "resumed"]
    row["resumed_at"] = resumed
    if status or resumed != [steps]:
        row["ok"] = False
        row["notes"].append(
            f"save/resume: exited {status}, resumed at {resumed} (expected [{steps}]; see {log.name})"
        )
    if not name.endswith("_vl"):  # generate serves the text models
        gen = [sys.executable, "-m", "hyper_parallel.generate", str(folder), "--prompt", "def ",
               "--max-new-tokens", "8", "--device", device]  # fmt: skip
        status, _ = _run(gen, 120, out / f"{config}-generate.log")
        text = (out / f"{config}-generate.log").read_text(encoding="utf-8")
        row["generated"] = text[-200:]
        if status != 0:
            row["ok"] = False
            row["notes"].append(f"generate exited {status}")
    print(_format(row), flush=True)
    return row


def _tiny_gpu_overrides(config: str) -> dict[str, Any]:
    """A GPU config's tiny mode: its ``TINY_OVERRIDES`` shape, 64 tokens, two float32 steps."""
    return {
        **{f"model.overrides.{k}": v for k, v in TINY_OVERRIDES[config].items()},
        "training.seq_len": 64,
        "training.max_steps": 2,
        "metrics.log_freq": 1,
        "lr_scheduler.warmup_steps": 1,
        "training.mixed_precision_param": "float32",
    }


def _trained(out: Path, config: str, tag: str, overrides: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``config`` trained with ``overrides``: its last logged tokens/s, MFU and peak memory beside the
    preflight's memory estimate for the same settings, whether it passed, and the time it took."""
    from hyper_parallel.config import load_config
    from hyper_parallel.preflight import estimate

    status, seconds, metrics, log = _train(config, out, tag, overrides, timeout)
    last = [r for r in _records(metrics) if "tokens_per_second" in r][-1:]
    est = estimate(
        load_config(ROOT / "configs" / f"{config}.yaml", {k: str(v) for k, v in overrides.items()}), 1
    )
    return {
        "ok": status == 0 and bool(last),
        "seconds": round(seconds, 1),
        "tokens_per_second": last[0]["tokens_per_second"] if last else None,
        "mfu": last[0].get("mfu") if last else None,
        "peak_memory_gib": last[0].get("memory_gib") if last else None,
        "preflight_memory_gib": None if est is None else est.device_total / 2**30,
        "notes": [] if status == 0 else [f"exited {status} (see {log.name})"],
    }


def _speed_rows(out: Path, tiny: bool, compiled: bool) -> list[dict[str, Any]]:
    """The shipped GPU configs through the trainer, compiled or not (compile only on CUDA)."""
    rows = []
    for config in GPU_CONFIGS:
        # 20 steps logged every 10: the record read is steps 11-20, after compilation and warm-up.
        overrides: dict[str, Any] = {"compile.enable": str(compiled).lower(), "training.max_steps": 20}
        if tiny:
            overrides.update(_tiny_gpu_overrides(config))
        tag = f"{config}-{'compiled' if compiled else 'eager'}"
        row = {
            "step": "speed",
            "config": config,
            "compiled": compiled,
            **_trained(out, config, tag, overrides, 300),
        }
        print(_format(row), flush=True)
        rows.append(row)
    rows.extend(_packed_rows(out, tiny, compiled))
    return rows


#: Tokens a row of the packed rows in the tiny mode: long enough for rows of several real documents.
TINY_PACKED_SEQ_LEN = 512
#: The prepared folders of this process's checks (one prepare per check, its eager and compiled rows).
_PREPARED: dict[tuple[Path, int], dict[str, Any]] = {}


def _packed_corpus(out: Path, tiny: bool) -> dict[str, Any]:
    """The standard library's files prepared into ``out/packed-text`` (``bench.packed_text``) by
    ``python -m hyper_parallel.data prepare``, once per check: what the folder holds, or ``error``."""
    from hyper_parallel.config import load_config

    folder = out / "packed-text"
    config = ROOT / "configs" / f"{GPU_CONFIGS[0]}.yaml"  # its tokenizer, every GPU config's
    seq_len = TINY_PACKED_SEQ_LEN if tiny else load_config(config).training.seq_len
    if (folder, seq_len) in _PREPARED:
        return _PREPARED[folder, seq_len]
    files = packed_text.chosen_files(seq_len)
    corpus: dict[str, Any] = {"folder": folder, "seq_len": seq_len}
    if len(files) < 2:  # a Python shipped without its sources (only .pyc files)
        corpus["error"] = f"{len(files)} standard-library source files of {seq_len // 16}-{seq_len} bytes"
        return corpus
    shutil.rmtree(folder, ignore_errors=True)  # prepare wants a new or empty folder
    status, _ = _run(packed_text.prepare_command(files, folder, config), 120, out / "packed-text.log")
    if status != 0 or not (folder / "manifest.json").exists():
        corpus["error"] = f"prepare exited {status} (see packed-text.log)"
    else:
        corpus["data"] = packed_text.describe(folder, files)
        _PREPARED[folder, seq_len] = corpus
    return corpus


def _packed_rows(out: Path, tiny: bool, compiled: bool) -> list[dict[str, Any]]:
    """The shipped GPU configs trained on prepared real text, packed, document masking on: tokens/s, MFU
    and peak memory as in :func:`_speed_rows`, and the documents a row held (the trainer's
    ``documents_per_row``); fails unless each file became one document and rows held more than one."""
    corpus = _packed_corpus(out, tiny)
    rows = []
    for config in GPU_CONFIGS:
        row: dict[str, Any] = {"step": "speed", "config": f"{config} packed", "compiled": compiled}
        if "error" in corpus:
            row.update(ok=False, notes=[corpus["error"]])
        else:
            overrides: dict[str, Any] = {"compile.enable": str(compiled).lower(), "training.max_steps": 20}
            if tiny:
                overrides.update(_tiny_gpu_overrides(config))
                overrides["training.seq_len"] = corpus["seq_len"]
            overrides.update(packed_text.training_overrides(corpus["folder"]))
            tag = f"{config}-packed-{'compiled' if compiled else 'eager'}"
            row.update(_trained(out, config, tag, overrides, 300))
            data = corpus["data"]
            per_row = packed_text.documents_per_row(_records(out / f"{tag}.jsonl"))
            row.update(data=data, documents_per_row=per_row)
            row["notes"].insert(
                0,
                f"{data['kind']} (python {data['python']}): {data['documents']:,} documents, mean "
                f"{data['mean_tokens']:,.0f} tokens; {'-' if per_row is None else format(per_row, '.2f')} "
                "documents/row",
            )
            if data["documents"] != data["files"]:
                row["ok"] = False
                row["notes"].append(f"{data['files']} files prepared into {data['documents']} documents")
            if row["ok"] and (per_row is None or per_row <= 1):
                row["ok"] = False
                row["notes"].append("rows held one document each: not packed")
        print(_format(row), flush=True)
        rows.append(row)
    return rows


#: A timing run saves nothing, said as such (a fine-tune with saving off is refused unless it is written).
_LORA = {
    "peft._target_": "hyper_parallel.components.peft.LoRA.Config",
    "peft.rank": 16,
    "checkpoint.enable": "false",
}
#: LoRA and QLoRA settings of the ``finetune`` step (the adapters' defaults: attention and MLP projections):
#: the base in float32, in bfloat16, NF4, and NF4 with the embeddings.
FINETUNE_RUNS: dict[str, dict[str, Any]] = {
    "full": {},
    "lora": _LORA,
    "lora_bf16": {**_LORA, "peft.base_dtype": "bfloat16"},
    "qlora": {**_LORA, "peft.base_dtype": "nf4"},
    "qlora_embeddings": {**_LORA, "peft.base_dtype": "nf4", "peft.quantize_embeddings": True},
}


def _finetune_rows(out: Path, tiny: bool) -> list[dict[str, Any]]:
    """Full fine-tuning, LoRA and QLoRA (``FINETUNE_RUNS``) of the Llama 3.2-1B GPU config through the
    trainer (eager), one after the other: tokens/s (and its ratio to the full run's), peak memory beside
    the preflight's; then QLoRA on the Qwen 3.5 debug config in bf16, its peak against the preflight
    (issue 34's 15%)."""
    rows: list[dict[str, Any]] = []
    plans: list[tuple[str, str, dict[str, Any]]] = []
    for method, settings in FINETUNE_RUNS.items():
        overrides: dict[str, Any] = {"training.max_steps": 20, **settings}
        if tiny and method not in ("full", "lora"):  # NF4 needs weights of 16,384 values or more, which the
            continue  # tiny ones are not; a bf16 base computes in bf16, the tiny runs in float32
        if tiny:
            overrides.update(_tiny_gpu_overrides("llama3_2_1b_gpu"))
        plans.append(("llama3_2_1b_gpu", method, overrides))
    debug = {**FINETUNE_RUNS["qlora"], "training.max_steps": 2 if tiny else 10, "metrics.log_freq": 1,
             "training.mixed_precision_param": "float32" if tiny else "bfloat16"}  # fmt: skip
    if tiny:
        debug.update({"training.seq_len": 64, "dataloader.dataset.source": "synthetic"})
    plans.append(("qwen3_5_debug", "qlora", debug))
    full_tps = None
    for config, method, overrides in plans:
        run = _trained(out, config, f"{config}-{method}", overrides, 240)
        tps = run["tokens_per_second"]
        if config == "llama3_2_1b_gpu" and method == "full":
            full_tps = tps
        row: dict[str, Any] = {
            "step": "finetune",
            "config": f"{config} {method}",
            **run,
            "step_vs_full": full_tps / tps if full_tps and tps and config == "llama3_2_1b_gpu" else None,
        }
        if row["step_vs_full"] is not None:
            row["notes"].append(f"step {row['step_vs_full']:.2f}x the full fine-tuning step")
        print(_format(row), flush=True)
        rows.append(row)
    return rows


#: Where ``bench/peers/README.md`` puts the peers' wheels for a machine without network (``--wheels``).
WHEELS = ROOT / "wheels"


def _peer_packages(out: Path, wheels: Path) -> str | None:
    """Install the carried wheels (``wheels``) into ``out/peer-packages`` when TorchTitan is not importable;
    the folder the peer rows then find them in, or None (nothing carried or nothing needed)."""
    import importlib.util

    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if importlib.util.find_spec("torchtitan") is not None or not found:
        return None
    target = out / "peer-packages"
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
               "--target", str(target), *map(str, found)]  # fmt: skip
    status, _ = _run(command, 120, out / "peer-packages.log")
    return str(target) if status == 0 else None


def _peer_rows(out: Path, tiny: bool, cuda: bool) -> list[dict[str, Any]]:
    """Ours, transformers (tied), Liger and TorchTitan timed by one harness (:mod:`bench.peers.harness`),
    each row in its own process, eager against eager and compiled against compiled; a row whose tokens a
    step or parameter count differ from ours fails (the comparison would not be of the same work)."""
    from bench.peers.harness import plan

    packages = _peer_packages(out, WHEELS)
    if packages:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [packages, os.environ.get("PYTHONPATH")]))
    rows: list[dict[str, Any]] = []
    for peer, compiled in plan(tiny, cuda):
        tag = f"peer-{peer}-{'compiled' if compiled else 'eager'}"
        json_path = out / f"{tag}.json"
        json_path.unlink(missing_ok=True)
        command = [sys.executable, "-m", "bench.peers.harness", peer, "--json", str(json_path)]
        command += ["--tiny"] if tiny else []
        command += ["--compile"] if compiled else []
        status, seconds = _run(command, 240, out / f"{tag}.log")
        row: dict[str, Any] = {"step": "peers", "config": peer, "compiled": compiled, "ok": False,
                               "seconds": round(seconds, 1), "notes": []}  # fmt: skip
        if status == 0 and json_path.exists():
            measured = json.loads(json_path.read_text(encoding="utf-8"))
            row.update({k: v for k, v in measured.items() if k not in ("peer", "notes")})
            row["ok"] = True
            if "skipped" in measured:
                row["notes"].append(f"skipped: {measured['skipped']}")
            else:
                row["notes"].append(
                    f"median of {measured['steps']}: {measured['median_s'] * 1e3:.1f} ms (min "
                    f"{measured['min_s'] * 1e3:.1f}, max {measured['max_s'] * 1e3:.1f}, IQR "
                    f"{measured['iqr_s'] * 1e3:.1f})"
                )
                row["notes"] += measured["notes"]
        else:
            row["notes"].append(f"exited {status} (see {tag}.log)")
        rows.append(row)
    for row in rows:
        ours = next((r for r in rows if r["config"] == "ours" and r["compiled"] == row["compiled"]), None)
        if ours is not None and "parameters" in row and "parameters" in ours:
            for key in ("tokens_per_step", "parameters"):
                if row[key] != ours[key]:
                    row["ok"] = False
                    row["notes"].append(f"{key} {row[key]:,}, ours {ours[key]:,}: not the same work")
    for row in rows:
        if row["config"] == "ours_hf":
            _hf_path_ratios(row, rows, tiny)
        print(_format(row), flush=True)
    return rows


def _hf_path_ratios(hf: dict[str, Any], rows: list[dict[str, Any]], tiny: bool) -> None:
    """On the ``ours_hf`` row (the trainer on the transformers path), issue 45 item 7's two ratios of the
    same setting's rows: ``trainer_vs_bare_loop`` (its tokens/s over ``hf_loop``'s, at least
    ``bench.hf_path.TARGET``) and ``native_vs_hf_path`` (``ours``' over its own, above 1: the native model
    stays ahead on the same shape), each with ``_ok``. The row fails on a missed target on CUDA; tiny CPU
    steps on shared cores time nothing a target could hold, so there the ratios are only reported."""
    from bench.hf_path import TARGET

    def speed(config: str) -> float | None:
        found = [r for r in rows if r["config"] == config and r["compiled"] == hf["compiled"]]
        value = found[0].get("tokens_per_second") if found else None
        return value if isinstance(value, float | int) and value > 0 else None

    ours, theirs, loop = speed("ours"), speed("ours_hf"), speed("hf_loop")
    checks = (
        ("trainer_vs_bare_loop", "trainer / bare loop", theirs, loop, TARGET, ">="),
        ("native_vs_hf_path", "native / hf path", ours, theirs, 1.0, ">"),
    )
    for key, label, top, bottom, target, relation in checks:
        ratio = None if top is None or bottom is None else top / bottom
        passed = ratio is not None and (ratio >= target if relation == ">=" else ratio > target)
        hf[key], hf[f"{key}_ok"] = ratio, passed
        shown = "-" if ratio is None else f"{ratio:.3f}x"
        held = " (not held in the tiny mode)" if tiny else ""
        hf["notes"].append(f"{label} {shown}: {'PASS' if passed else 'FAIL'} ({relation} {target}x){held}")
        if not tiny and not passed:
            hf["ok"] = False


def _format(row: dict[str, Any]) -> str:
    def shown(key: str, spec: str) -> str:
        value = row.get(key)
        return "-" if value is None else format(value, spec)

    setting = "compiled" if row.get("compiled") else ""
    return (
        f"| {row['step']:<12} | {row['config']:<22} | {setting:<8} | {'PASS' if row['ok'] else 'FAIL'} "
        f"| {shown('tokens_per_second', ',.0f'):>10} | {shown('mfu', '.1f'):>5} "
        f"| {shown('peak_memory_gib', '.2f'):>8} | {shown('preflight_memory_gib', '.2f'):>9} "
        f"| {'; '.join(row.get('notes', []))}"
    )


HEADER = (
    "| step         | config                 | setting  | ok   |   tokens/s |  MFU% | peak GiB | preflight "
    "| notes\n"
    "|--------------|------------------------|----------|------|-----------:|------:|---------:|----------:|------"
)


def median_ms(run: Callable[[], None], repeats: int) -> float:
    """Median wall time of ``run`` (which waits for its device work) over ``repeats`` calls, after three."""
    from bench.gpu import step_seconds

    samples = sorted(step_seconds(run, warmup=3, steps=repeats, sync=lambda: None))
    return samples[len(samples) // 2] * 1e3


#: (batch, seq, heads, kv_heads, head_dim) of the attention measurements: the Llama 3.2-1B layer, 2 x 4,096.
ATTENTION_SHAPE = (2, 4096, 32, 8, 64)


#: The short documents that follow one long one in a 4,096-token row of the long-and-short layout.
LONG_AND_SHORT = (256, 160, 96)


def long_and_short_ids(seq: int) -> Any:
    """(seq,) document ids: one long document, then ``LONG_AND_SHORT`` scaled to ``seq`` tokens."""
    import torch

    short = [max(1, n * seq // 4096) for n in LONG_AND_SHORT]
    lengths = [seq - sum(short), *short]
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


def attention_inputs(shape: tuple[int, int, int, int, int], device: Any, dtype: Any) -> tuple[Any, ...]:
    """``q, k, v`` (requiring gradients), an output gradient, all (batch, seq, heads, head_dim) on
    ``device``, and the document ids of four layouts in host memory: one document a row, two (all but the
    last 96 tokens, and those), one long and three short ones (``LONG_AND_SHORT``, scaled to the row) and
    packed documents of 64 to 1,024 tokens. Seeded: every caller measures the same numbers."""
    import torch

    batch, seq, heads, kv_heads, head_dim = shape
    generator = torch.Generator().manual_seed(0)

    def tensor(h: int) -> Any:
        return torch.randn(batch, seq, h, head_dim, generator=generator).to(device, dtype).requires_grad_()

    q, k, v = tensor(heads), tensor(kv_heads), tensor(kv_heads)
    grad = torch.randn(batch, seq, heads, head_dim, generator=generator).to(device, dtype)
    lengths = torch.randint(64, 1025, (seq,), generator=generator)
    host_ids = {
        "one_document": torch.zeros(batch, seq, dtype=torch.long),
        "two_documents": (torch.arange(seq) >= seq - 96).long().expand(batch, seq),
        "long_and_short": long_and_short_ids(seq).expand(batch, seq),
        "packed": torch.repeat_interleave(torch.arange(seq), lengths)[:seq].expand(batch, seq),
    }
    return q, k, v, grad, host_ids


def attention_times(tiny: bool) -> dict[str, Any]:
    """Forward + backward of one attention layer at the Llama 3.2-1B shape, 2 x 4,096 tokens (tiny: 256):
    plain causal SDPA against document masking as the trainer runs it (ids read on the host, the layout
    chosen there: :meth:`hyper_parallel.models._layers.AttentionPlan.documents`), for one document per row,
    two per row (4,000 and 96 tokens: one causal call each on CUDA) and packed documents of 64 to 1,024
    tokens (FlexAttention's block mask on CUDA). For the long-and-short rows every kernel that serves
    them (:func:`kernel_times`). On CUDA also where the time goes: FlexAttention's mask for one document a
    row, SDPA's kernels, FlexAttention with a plain causal mask.
    """
    import torch

    from hyper_parallel.models._layers import AttentionPlan, FlexBlockMask, attention

    cuda = torch.cuda.is_available() and not tiny
    device = torch.device("cuda" if cuda else "cpu")
    shape = ATTENTION_SHAPE if not tiny else (1, 256, 4, 2, 16)
    batch, seq = shape[:2]
    q, k, v, grad, host_ids = attention_inputs(shape, device, torch.bfloat16 if cuda else torch.float32)
    plan = AttentionPlan.for_device(device)
    layouts = {
        "causal": None,
        **{name: plan.documents(ids, (batch, seq), device) for name, ids in host_ids.items()},
    }

    def once(documents: Any, run: Callable[..., Any] = attention) -> None:
        out = run(q, k, v, documents)
        torch.autograd.backward(out, grad)
        if cuda:
            torch.cuda.synchronize()
        q.grad = k.grad = v.grad = None

    repeats = 5 if tiny else 20
    result: dict[str, Any] = {"device": str(device), "seq": seq, "batch": batch}
    for name, documents in layouts.items():
        result[f"{name}_ms"] = median_ms(functools.partial(once, documents), repeats)
        result[f"{name}_layout"] = type(None if documents is None else documents.layout).__name__
    for name in host_ids:
        result[f"{name}_vs_causal"] = result[f"{name}_ms"] / result["causal_ms"]
    result["worst_vs_causal"] = max(result[f"{name}_vs_causal"] for name in host_ids)
    result.update(kernel_times(host_ids["long_and_short"], once, result["causal_ms"], repeats, device))
    if cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.flex_attention import create_block_mask

        flex_one = plan.documents(host_ids["one_document"].to(device), (batch, seq))
        result["flex_one_document_ms"] = median_ms(lambda: once(flex_one), repeats)
        for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
            try:
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    result[f"sdpa_{backend.lower()}_ms"] = median_ms(lambda: once(None), repeats)
            except RuntimeError as error:
                result[f"sdpa_{backend.lower()}_ms"] = f"{type(error).__name__}: {str(error)[:120]}"
        causal_mask = create_block_mask(
            lambda b, h, q_index, kv_index: q_index >= kv_index, None, None, seq, seq, device=device
        )
        assert plan.flex is not None
        plain = flex_one._replace(layout=FlexBlockMask(causal_mask, plan.flex))
        result["flex_causal_mask_ms"] = median_ms(lambda: once(plain), repeats)
        flash = result["sdpa_flash_attention_ms"]
        if isinstance(flash, float):  # the variable-length kernel is flash attention's: its own floor
            for name in ("varlen", "varlen_compiled"):
                if isinstance(result[f"{name}_ms"], float):
                    result[f"{name}_vs_flash_causal"] = result[f"{name}_ms"] / flash
    return result


def kernel_times(
    ids: Any, once: Callable[..., None], causal_ms: float, repeats: int, device: Any
) -> dict[str, Any]:
    """Each kernel that can keep ``ids``' documents apart, timed by ``once(documents, attention)`` against
    ``causal_ms``: ``varlen`` (the compiled blocks' plan's variable-length kernel: torch's ``varlen_attn``
    on CUDA where torch has it, the per-document reference elsewhere), ``varlen_compiled`` (the same inside
    ``torch.compile(fullgraph=True)``, which fails on a graph break), ``varlen_fa3`` (``varlen`` with
    flash attention 3 activated, where torch can: ``torch.nn.attention.activate_flash_attention_impl``),
    ``flex`` (the block mask, CUDA only) and ``slices`` (one causal call per document). A kernel that cannot
    run here is a string saying why."""
    import attrs
    import torch

    from hyper_parallel.models import _layers

    batch, seq = ids.shape
    plan = _layers.AttentionPlan.for_device(device, compiled=True)
    varlen = attrs.evolve(plan, varlen=plan.varlen or _layers.per_document_attention)
    variants: dict[str, Any] = {
        "varlen": varlen.documents(ids, (batch, seq), device),
        "slices": _layers.AttentionPlan(slice_max_documents=seq).documents(ids, (batch, seq), device),
    }
    if plan.flex is not None:
        variants["flex"] = plan.documents(ids.to(device), (batch, seq))
    result: dict[str, Any] = {}
    for name, documents in variants.items():
        result[f"{name}_ms"] = median_ms(functools.partial(once, documents), repeats)
    compiled = torch.compile(_layers.attention, fullgraph=True)
    try:
        result["varlen_compiled_ms"] = median_ms(lambda: once(variants["varlen"], compiled), repeats)
    except Exception as error:  # a graph break under fullgraph, or a kernel that does not compile here
        result["varlen_compiled_ms"] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"
    if plan.varlen is not None:
        from torch.nn import attention as torch_attention

        try:
            torch_attention.activate_flash_attention_impl("FA3")
            try:
                result["varlen_fa3_ms"] = median_ms(functools.partial(once, variants["varlen"]), repeats)
            finally:
                torch_attention.restore_flash_attention_impl()
        except Exception as error:  # no FA3 on this image (its kernels are a separate package)
            result["varlen_fa3_ms"] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"
    for name in (*variants, "varlen_compiled", "varlen_fa3"):
        if isinstance(result.get(f"{name}_ms"), float):
            result[f"{name}_vs_causal"] = result[f"{name}_ms"] / causal_ms
    result["varlen_kernel"] = getattr(variants["varlen"].layout.kernel, "__qualname__", "?")
    return result


def _own_process(
    out: Path, step: str, config: str, module: str, function: str, tiny: bool
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``module.function(tiny)`` in its own process (its imports and kernels stay there), its result as
    JSON in ``out/STEP.json`` and its output in ``out/STEP.log``: the step's row (not yet passed) and the
    result, or None with the exit status in the row's notes."""
    json_path = out / f"{step}.json"
    code = (
        f"import json, sys; from {module} import {function}; "
        f"open(sys.argv[1], 'w').write(json.dumps({function}({tiny}), default=str))"
    )
    status, seconds = _run([sys.executable, "-c", code, str(json_path)], 180, out / f"{step}.log")
    row: dict[str, Any] = {"step": step, "config": config, "ok": False, "seconds": round(seconds, 1),
                           "notes": []}  # fmt: skip
    if status == 0 and json_path.exists():
        return row, json.loads(json_path.read_text(encoding="utf-8"))
    row["notes"].append(f"exited {status} (see {step}.log)")
    return row, None


def _attention_row(out: Path, tiny: bool) -> dict[str, Any]:
    """:func:`attention_times` in its own process; passes when masking costs at most 1.2x causal."""
    config = "4096 tokens" if not tiny else "tiny"
    row, times = _own_process(out, "attention", config, "bench.gpu_check", "attention_times", tiny)
    if times is not None:
        row.update(times)
        # A CPU takes the variable-length path, a different kernel: the ratio is bounded on CUDA only.
        row["ok"] = tiny or times["worst_vs_causal"] <= ATTENTION_TOLERANCE
        row["notes"].append(
            f"causal {times['causal_ms']:.2f} ms; masked, documents a row: one "
            f"{times['one_document_vs_causal']:.2f}x, two {times['two_documents_vs_causal']:.2f}x, "
            f"one long and a few short {times['long_and_short_vs_causal']:.2f}x "
            f"({times['long_and_short_layout']}), packed {times['packed_vs_causal']:.2f}x"
        )
        kernels = [
            f"{name} {times[name + '_vs_causal']:.2f}x"
            for name in ("varlen", "varlen_compiled", "varlen_fa3", "flex", "slices")
            if name + "_vs_causal" in times
        ]
        if "varlen_vs_flash_causal" in times:
            kernels.append(f"varlen / causal flash SDPA {times['varlen_vs_flash_causal']:.2f}x")
        row["notes"].append(
            f"long and short rows by kernel against causal (target <= {ATTENTION_TOLERANCE}x): "
            + ", ".join(kernels)
            + (
                ""
                if isinstance(times["varlen_compiled_ms"], float)
                else f"; compiled: {times['varlen_compiled_ms']}"
            )
        )
    print(_format(row), flush=True)
    return row


def _fla_row(out: Path, tiny: bool) -> dict[str, Any]:
    """:func:`bench.fla_check.fla_check` in its own process (fla's import and Triton kernels stay there)."""
    from bench.fla_check import QWEN_TOKENS_TARGET

    config = "qwen3_5 0.8B" if not tiny else "tiny"
    row, found = _own_process(out, "fla", config, "bench.fla_check", "fla_check", tiny)
    if found is not None:
        row.update(found)
        worst = {
            label: max(found[f"{label}_errors"].items(), key=lambda item: item[1])
            for label in ("one_document", "two_documents")
            if f"{label}_errors" in found
        }
        row["notes"].append(
            f"kernel {found['kernel']} (key head size {found['key_head_dim']}: {found['key_tile']}-wide key "
            f"tile); worst relative difference from our chunked kernel: "
            + ", ".join(f"{label} {name} {error:.2g}" for label, (name, error) in worst.items())
            + "".join(
                f"; {label}: {found[f'{label}_problem']}"
                for label in ("one_document", "two_documents")
                if found[f"{label}_problem"]
            )
        )
        row["notes"].append(
            f"forward + backward: chunked {found['chunked_ms']:.2f} ms, fla "
            + ("-" if found["fla_ms"] is None else f"{found['fla_ms']:.2f} ms")
            + f"; the compiled qwen3_5_0_8b_gpu speed row's target: >= {QWEN_TOKENS_TARGET:,} tokens/s"
        )
        row["notes"].extend(found["warnings"])
    print(_format(row), flush=True)
    return row


def _tests_row(out: Path, cuda: bool) -> dict[str, Any]:
    """The suite's ``cuda``-marked tests."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda",
               "tests/models/test_cuda_paths.py"]  # fmt: skip
    status, seconds = _run(command, 240, out / "tests.log")
    # pytest's 5: every test deselected (no CUDA); 0 with every test skipped is the CPU's outcome too.
    row = {"step": "tests", "config": "-m cuda", "ok": status in ((0,) if cuda else (0, 5)),
           "seconds": round(seconds, 1), "notes": [f"pytest exit {status} (see tests.log)"]}  # fmt: skip
    print(_format(row), flush=True)
    return row


#: The check's steps, in the order they run (fine-tuning last: a spent budget cuts it first); ``--parts``
#: picks some of them.
PARTS = ("tests", "debug", "attention", "fla", "eager", "peers", "compiled", "finetune")


def check(tiny: bool, out: Path, budget: float = DEFAULT_BUDGET, parts: tuple[str, ...] = PARTS) -> int:
    """Run every step within ``budget`` seconds; write ``out/check.json`` after each; 0 when all passed.

    The small steps (the cuda tests, the debug configs) run side by side; the timed ones one at a time
    after them (attention, the trainer eager, the peers' harness, the trainer compiled), so that a
    budget spent early loses the least: a step that cannot start in time is a failed row saying so.
    """
    import torch

    global _DEADLINE
    _DEADLINE = Deadline(budget)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not tiny
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []

    def write() -> None:
        result = {
            "device": torch.cuda.get_device_name(0) if cuda else "cpu",
            "torch": torch.__version__,
            "tiny": tiny,
            "seconds": round(time.perf_counter() - started, 1),
            "flops_convention": CONVENTION,
            "rows": rows,
        }
        (out / "check.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")

    print(HEADER, flush=True)
    with ThreadPoolExecutor(max_workers=2) as pool:
        small: list[Future[Any]] = []
        if "tests" in parts:
            small.append(pool.submit(_tests_row, out, cuda))
        if "debug" in parts:
            small.append(pool.submit(_debug_rows, out, tiny, "cuda" if cuda else "cpu"))
        for future in small:
            found = future.result()
            rows.extend(found if isinstance(found, list) else [found])
            write()
    for step in [p for p in PARTS[2:] if p in parts]:
        if step == "attention":
            rows.append(_attention_row(out, tiny))
        elif step == "fla":
            rows.append(_fla_row(out, tiny))
        elif step == "finetune":
            rows.extend(_finetune_rows(out, tiny))
        elif step == "eager":
            rows.extend(_speed_rows(out, tiny, compiled=False))
        elif step == "peers":
            rows.extend(_peer_rows(out, tiny, cuda))
        elif step == "compiled" and not tiny:
            rows.extend(_speed_rows(out, tiny, compiled=True))
        write()
    failed = [r for r in rows if not r["ok"]]
    print(f"MFU: {CONVENTION}")
    print(
        f"{len(rows) - len(failed)}/{len(rows)} passed in {time.perf_counter() - started:.0f} s; "
        f"wrote {out / 'check.json'}"
    )
    return 1 if failed else 0


def main(tiny: bool, out: str | None, budget: float = DEFAULT_BUDGET, parts: tuple[str, ...] = PARTS) -> int:
    folder = Path(out or os.environ.get("OUT") or "bench-gpu-check")
    import torch

    if not tiny and not torch.cuda.is_available():
        print("bench gpu --check: skipped, no CUDA device here (--tiny runs the CPU smoke mode)")
        return 0
    return check(tiny, folder.resolve(), budget, parts)
