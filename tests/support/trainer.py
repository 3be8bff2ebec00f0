"""Shared by the trainer tests: tiny versions of the shipped debug configs, the layout grid, the worker.

``WORKER`` is the script the multi-process trainer tests run under ``tests.support.processes.torchrun``.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from hyper_parallel.config import ConfigWarning, load_config
from hyper_parallel.trainer.config import TrainerConfig
from tests.support import ROOT

__all__ = [
    "GRID",
    "QUIET",
    "ROOT",
    "TINY_MODELS",
    "TINY_RUN",
    "WORKER",
    "Layout",
    "as_flags",
    "checkpointed_run_argv",
    "debug_config_path",
    "grid_config",
    "grid_overrides",
    "launch",
    "llama_run_config",
    "tiny_config",
    "tiny_overrides",
    "train_runs_under_torchrun",
    "write_hf_weights",
]

#: Launch flags of a one-step run that logs that step.
QUIET = ["--training.max_steps", "1", "--metrics.log_freq", "1"]

#: The torchrun worker of the multi-process trainer tests (see its docstring for what each rank reports).
WORKER = str(Path(__file__).with_name("trainer_worker.py"))

#: Model arguments small enough for a CPU test step in milliseconds, per shipped debug config.
TINY_MODELS: dict[str, dict[str, str]] = {
    "llama3": {
        "model.overrides.dim": "64",
        "model.overrides.n_layers": "2",
        "model.overrides.n_heads": "4",
        "model.overrides.n_kv_heads": "2",
        "model.overrides.multiple_of": "32",
    },
    "qwen3_5": {
        "model.overrides.dim": "64",
        "model.overrides.n_layers": "2",
        "model.overrides.full_attention_interval": "2",
        "model.overrides.ffn_hidden_dim": "128",
        "model.overrides.n_heads": "4",
        "model.overrides.n_kv_heads": "2",
        "model.overrides.head_dim": "16",
        "model.overrides.linear_num_key_heads": "2",
        "model.overrides.linear_num_value_heads": "4",
        "model.overrides.linear_key_head_dim": "16",
        "model.overrides.linear_value_head_dim": "16",
    },
    "qwen3_5_moe": {
        "model.overrides.dim": "64",
        "model.overrides.n_layers": "2",
        "model.overrides.full_attention_interval": "2",
        "model.overrides.ffn_hidden_dim": "32",
        "model.overrides.n_experts": "4",
        "model.overrides.n_experts_per_token": "2",
        "model.overrides.shared_expert_hidden_dim": "64",
        "model.overrides.n_heads": "4",
        "model.overrides.n_kv_heads": "2",
        "model.overrides.head_dim": "16",
        "model.overrides.linear_num_key_heads": "2",
        "model.overrides.linear_num_value_heads": "4",
        "model.overrides.linear_key_head_dim": "16",
        "model.overrides.linear_value_head_dim": "16",
    },
    # The arguments are nested (text.*, vision.*): the whole overrides mapping, as YAML flow text.
    "qwen3_5_vl": {
        "model.overrides": "{text.vocab_size: 512, image_token_id: 259, text.dim: 64, text.n_layers: 2, "
        "text.full_attention_interval: 2, text.ffn_hidden_dim: 128, text.n_heads: 4, text.n_kv_heads: 2, "
        "text.head_dim: 16, text.linear_num_key_heads: 2, text.linear_num_value_heads: 4, "
        "text.linear_key_head_dim: 16, text.linear_value_head_dim: 16, vision.depth: 1, "
        "vision.hidden_size: 32, vision.n_heads: 2, vision.intermediate_size: 64}",
    },
}

#: A short run on synthetic tokens: nothing to tokenise, exact arithmetic (fp32), no files written.
TINY_RUN: dict[str, str] = {
    "dataloader.dataset.source": "synthetic",
    "training.max_steps": "4",
    "training.global_batch_size": "4",
    "training.micro_batch_size": "2",
    "training.seq_len": "32",
    "lr_scheduler.warmup_steps": "1",
    "metrics.enable_jsonl": "false",
    "metrics.jsonl_path": "metrics.jsonl",  # the default: an option of a sink that is off is refused
    "metrics.log_freq": "1000",
}


#: Overrides wrapping every block in full activation checkpointing and compiling the model with
#: ``aot_eager`` (dynamo and AOT autograd, no code generation): a run with them must give the plain losses.
CHECKPOINTED_AND_COMPILED = {
    "activation_checkpoint.mode": "full",
    "compile.enable": "true",
    "compile.components": "[model]",
    "compile.backend": "aot_eager",
}


def saving_every_two_steps(folder: Path) -> dict[str, str]:
    """Overrides checkpointing into ``folder`` every 2 steps, with the optimizer (so a resume repeats the
    steps after the checkpoint it starts from)."""
    return {
        "checkpoint.enable": "true",
        "checkpoint.folder": str(folder),
        "checkpoint.interval": "2",
        "checkpoint.last_save_model_only": "false",
    }


def debug_config_path(model: str) -> Path:
    """The shipped ``configs/<model>_debug.yaml``."""
    return ROOT / "configs" / f"{model}_debug.yaml"


def tiny_overrides(model: str, **extra: str) -> dict[str, str]:
    """Command-line style overrides turning the shipped debug config of ``model`` into a tiny run."""
    return {**TINY_MODELS[model], **TINY_RUN, **extra}


def tiny_config(model: str = "llama3", overrides: Mapping[str, Any] | None = None) -> TrainerConfig:
    """The shipped debug config of ``model``, shrunk by ``tiny_overrides`` and then ``overrides``."""
    with warnings.catch_warnings():  # a tiny run logs no metrics on purpose (metrics.log_freq 1000)
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(debug_config_path(model), {**tiny_overrides(model), **(overrides or {})})


def train_runs_under_torchrun(
    world: int, folder: Path, runs: Mapping[str, tuple[str, Mapping[str, str]]], *, timeout: float = 600
) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """Train every ``name -> (model, overrides)`` run, one after the other, in one torchrun job of ``world``
    ranks (``WORKER many``): each run's reports by global rank, and the job's stderr. Start-up is paid once
    for all of them."""
    from tests.support.processes import torchrun

    folder.mkdir(parents=True, exist_ok=True)
    spec = [
        {"model": model, "out": str(folder / name), "overrides": dict(overrides)}
        for name, (model, overrides) in runs.items()
    ]
    (folder / "runs.json").write_text(json.dumps(spec))
    done = torchrun(world, WORKER, "many", str(folder / "runs.json"), timeout=timeout)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"
    reports = {
        name: [json.loads(Path(f"{folder / name}.rank{r}.json").read_text()) for r in range(world)]
        for name in runs
    }
    return reports, done.stderr


def checkpointed_run_argv(folder: Path, steps: int, **extra: str) -> list[str]:
    """Launch arguments of a tiny Llama 3 run of ``steps`` saving a full checkpoint at every step into
    ``folder``, all kept (what the checkpoint-bounds tests damage and resume), with ``extra`` overrides."""
    run = {
        "checkpoint.enable": "true",
        "checkpoint.interval": "1",
        "checkpoint.folder": str(folder),
        "checkpoint.keep_latest_k": "0",
        "checkpoint.last_save_model_only": "false",
        "training.max_steps": str(steps),
        **extra,
    }
    return ["--config-file", str(debug_config_path("llama3")), *as_flags(tiny_overrides("llama3", **run))]


def launch(*argv: str) -> tuple[int, str, str]:
    """``train_lm ARGV`` in this process: (exit status, stdout, stderr)."""
    from hyper_parallel.launch import main

    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def llama_run_config(
    folder: Path,
    *,
    data: str = "    source: python_docs\n",
    tokenizer: str = "ByteTokenizer.Config",
    model: str = "",
    save: bool | None = None,
) -> Path:
    """``folder/run.yaml``: a Llama 3 debug config (vocabulary 512) reading ``data`` (a dataset section's
    lines), with ``model`` and ``tokenizer`` lines; it saves checkpoints in ``folder`` when ``save`` says so
    (None: when it starts from weights, as a run from weights must save what it trains)."""
    text = (
        "model:\n  _target_: hyper_parallel.models.llama3.create_model_spec\n  flavor: debugmodel\n"
        f"{model}  overrides:\n    vocab_size: 512\n"
        f"tokenizer:\n  _target_: hyper_parallel.components.tokenizer.{tokenizer}\n"
        "dataloader:\n  _target_: hyper_parallel.components.dataloader.TextDataLoader.Config\n"
        f"  num_workers: 0\n  dataset:\n{data}"
        "training:\n  _target_: hyper_parallel.trainer.config.TrainingConfig\n  seq_len: 32\n"
        "  global_batch_size: 2\n  micro_batch_size: 2\n  mixed_precision_param: float32\n"
        "lr_scheduler:\n  _target_: hyper_parallel.components.lr_scheduler.WarmupDecay.Config\n"
        "  warmup_steps: 0\n"
    )
    if save is None:
        save = "weights_path" in model
    if save:
        text += "checkpoint:\n  _target_: hyper_parallel.components.checkpoint.DCPCheckpoint.Config\n"
        text += f"  enable: true\n  folder: {folder / 'checkpoints'}\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "run.yaml"
    path.write_text(text)
    return path


def as_flags(overrides: Mapping[str, str]) -> list[str]:
    """``{"a.b": "1"}`` as ``["--a.b", "1"]``."""
    flags: list[str] = []
    for key, value in overrides.items():
        flags += [f"--{key}", value]
    return flags


@attrs.frozen
class Layout:
    """One case of the layout grid: a tiny model, parallel degrees and batch, on ``world`` ranks."""

    name: str
    model: str
    world: int
    parallelism: dict[str, Any]
    training: dict[str, Any] = attrs.Factory(dict)


def _grid() -> list[Layout]:
    cases = []
    for model in ("llama3", "qwen3_5"):
        cases += [
            Layout(f"{model}-dp_shard2", model, 2, {"dp_shard": 2}),
            Layout(f"{model}-tp2", model, 2, {"dp_shard": 1, "tp": 2}),
            Layout(f"{model}-tp2-no-sp", model, 2, {"dp_shard": 1, "tp": 2, "sequence_parallel": False}),
            # sequence parallelism needs seq_len divisible by tp (refused before gloo would abort)
            Layout(f"{model}-tp2-seq31", model, 2, {"dp_shard": 1, "tp": 2}, {"seq_len": 31}),
            Layout(f"{model}-pp2", model, 2, {"dp_shard": 1, "pp": 2}),
            Layout(f"{model}-cp2", model, 2, {"dp_shard": 1, "cp": 2}),
            Layout(f"{model}-ddp2", model, 2, {"dp_shard": 1, "dp_replicate": 2}),
            Layout(f"{model}-ep2", model, 2, {"dp_shard": 2, "ep": 2}),
            Layout(f"{model}-dp_shard2-batch-6", model, 2, {"dp_shard": 2}, {"global_batch_size": 6}),
            Layout(f"{model}-tp4", model, 4, {"dp_shard": 1, "tp": 4}),
            Layout(f"{model}-dp_shard4", model, 4, {"dp_shard": 4}, {"micro_batch_size": 1}),
            Layout(f"{model}-dp_shard2-tp2", model, 4, {"dp_shard": 2, "tp": 2}, {"micro_batch_size": 1}),
            Layout(
                f"{model}-dp_shard2-tp2-no-sp",
                model,
                4,
                {"dp_shard": 2, "tp": 2, "sequence_parallel": False},
                {"micro_batch_size": 1},
            ),
            Layout(f"{model}-hsdp", model, 4, {"dp_shard": 2, "dp_replicate": 2}, {"micro_batch_size": 1}),
            Layout(
                f"{model}-hsdp-auto", model, 4, {"dp_shard": 2, "dp_replicate": -1}, {"micro_batch_size": 1}
            ),
            Layout(
                f"{model}-hsdp-batch-6",
                model,
                4,
                {"dp_shard": 2, "dp_replicate": 2},
                {"micro_batch_size": 1, "global_batch_size": 6},
            ),
            Layout(f"{model}-ddp4", model, 4, {"dp_shard": 1, "dp_replicate": 4}, {"micro_batch_size": 1}),
            Layout(
                f"{model}-ddp2-tp2-no-sp",
                model,
                4,
                {"dp_shard": 1, "dp_replicate": 2, "tp": 2, "sequence_parallel": False},
            ),
            # pipelines of the 2-layer tiny model (micro-batches of 2 sequences)
            Layout(f"{model}-pp2-gpipe", model, 2, {"dp_shard": 1, "pp": 2, "pp_schedule": "GPipe"}),
            Layout(f"{model}-pp2-microbatches-4", model, 2, {"dp_shard": 1, "pp": 2, "pp_microbatches": 4}),
            Layout(
                f"{model}-pp2-1f1b-microbatches-1", model, 2, {"dp_shard": 1, "pp": 2, "pp_microbatches": 1}
            ),
            Layout(
                f"{model}-pp2-interleaved-2-layers",
                model,
                2,
                {"dp_shard": 1, "pp": 2, "pp_schedule": "Interleaved1F1B"},
            ),
            Layout(f"{model}-pp2-micro-batch-1", model, 2, {"dp_shard": 1, "pp": 2}, {"micro_batch_size": 1}),
            Layout(f"{model}-pp2-dp_shard2", model, 4, {"dp_shard": 2, "pp": 2}),
            Layout(f"{model}-pp2-tp2", model, 4, {"dp_shard": 1, "pp": 2, "tp": 2}),
        ]
    moe = "qwen3_5_moe"
    cases += [
        Layout(f"{moe}-ep2", moe, 2, {"dp_shard": 2, "ep": 2}),
        Layout(f"{moe}-ep2-tp2", moe, 2, {"dp_shard": 1, "tp": 2, "ep": 2}),  # ep must divide dp_shard
        Layout(f"{moe}-ep4", moe, 4, {"dp_shard": 4, "ep": 4}, {"micro_batch_size": 1}),
        # ep 2 x dp_shard 4 trains in tests/trainer/test_expert_parallel.py (against one process)
        Layout(
            f"{moe}-ep2-hsdp", moe, 4, {"dp_shard": 2, "dp_replicate": 2, "ep": 2}, {"micro_batch_size": 1}
        ),
    ]
    return cases


#: Layouts run through both ``--dry-run`` checks and the runtime; their verdicts must agree.
GRID: list[Layout] = _grid()


def grid_config(case: Layout) -> TrainerConfig:
    """The tiny config of ``case`` built without the resolver's layout checks (``attrs.evolve``)."""
    base = tiny_config(case.model, {"training.max_steps": "1"})
    return attrs.evolve(
        base,
        parallelism=attrs.evolve(base.parallelism, **case.parallelism),
        training=attrs.evolve(base.training, **case.training),
    )


def grid_overrides(case: Layout) -> dict[str, str]:
    """The same case as command-line overrides, for the resolver (``load_config(..., world_size=)``)."""
    flags = {
        f"parallelism.{k}": str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in case.parallelism.items()
    }
    flags.update({f"training.{k}": str(v) for k, v in case.training.items()})
    return {**tiny_overrides(case.model), "training.max_steps": "1", **flags}


def write_hf_weights(folder: Path, change: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """The tiny Llama 3's initial weights in Hugging Face's layout, as ``folder/model.safetensors`` beside
    its ``config.json``; ``change`` edits the state dict (names to tensors) before it is written."""
    from safetensors.torch import save_file

    from hyper_parallel.models.llama3._runtime import Llama3StateDictAdapter

    spec = tiny_config("llama3").model
    model = spec.build_model_fn(spec.args, device="cpu")
    adapter = Llama3StateDictAdapter(spec.args)
    hf = adapter.to_hf({k: v.detach().clone() for k, v in model.state_dict().items()})
    if change is not None:
        change(hf)
    folder.mkdir(parents=True)
    save_file(hf, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(adapter.hf_config()))
    return folder
