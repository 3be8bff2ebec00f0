"""Run under torchrun by the multi-process trainer tests; each rank writes what it saw as JSON.

``trainer_worker.py train MODEL OUT [PATH=VALUE ...]`` trains the tiny debug config of MODEL with the
overrides and writes ``OUT.rank<r>.json``: per-step losses and grad norms, how every parameter is held
(DTensor placements, local and global shapes), a digest of its local values after training and how
the residual stream leaves the first block's ``ffn_norm``. ``trainer_worker.py many SPEC`` does the same
for every run a JSON file lists (``[{"model": ..., "out": ..., "overrides": {...}}, ...]``), one after the
other in one process group: a test module's layouts pay torchrun's and torch's start-up once, not per run.
MODEL may be the folder of a transformers model instead (``tests.support.hf_models.hf_config``).
``trainer_worker.py grid WORLD OUT`` runs every layout of ``GRID`` for this world size through the runtime
(resolver checks bypassed) and writes the verdicts.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from hyper_parallel.trainer import LLMTrainer
from tests.support.trainer import GRID, grid_config, tiny_config


def _params(trainer: LLMTrainer) -> dict[str, Any]:
    held: dict[str, Any] = {}
    for name, param in trainer.model.named_parameters():
        if isinstance(param, DTensor):
            local = param.to_local()
            held[name] = {
                "dtensor": True,
                "mesh": list(param.device_mesh.mesh_dim_names or ()),
                "placements": [repr(p) for p in param.placements],
                "local": list(local.shape),
                "global": list(param.shape),
                "local_type": type(local).__name__,  # NF4Tensor for QLoRA's base
                "local_dtype": str(local.dtype),
            }
        else:
            held[name] = {
                "dtensor": False,
                "local": list(param.shape),
                "global": list(param.shape),
                "local_dtype": str(param.dtype),
            }
    return held


def _experts(trainer: LLMTrainer) -> dict[str, Any]:
    """Which experts of the first MoE block this rank stores (its shard of ``w13``) and computes with.

    A tensor of expert ids distributed like ``w13`` gives the stored ids; under expert parallelism the
    rank computes with the experts of its ``ep`` coordinate (what the all-to-all sends it).
    """
    layers = getattr(trainer.model, "moe_layers", None)
    if not callable(layers):
        return {}
    moe = layers()[0]
    weight = moe.experts.w13
    n = weight.shape[0]
    ids = torch.arange(n, dtype=torch.float32).reshape(n, 1, 1)
    if isinstance(weight, DTensor):
        from torch.distributed.tensor import distribute_tensor

        stored = distribute_tensor(ids, weight.device_mesh, weight.placements, src_data_rank=None).to_local()
    else:
        stored = ids
    dispatcher = moe.dispatcher
    if dispatcher is None:
        computes = list(range(n))
    else:
        first = dist.get_rank(dispatcher.group) * dispatcher.n_local
        computes = list(range(first, first + dispatcher.n_local))
    return {"stored": [int(i) for i in stored.flatten().tolist()], "computes": computes}


def _watch_residual_norm(trainer: LLMTrainer) -> dict[str, Any]:
    """Fill, at the first forward, how the first block's ``ffn_norm`` output (residual stream) is held."""
    seen: dict[str, Any] = {}

    def record(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
        if seen:
            return
        local = output.to_local() if isinstance(output, DTensor) else output
        seen["dtensor"] = isinstance(output, DTensor)
        seen["placements"] = [repr(p) for p in output.placements] if isinstance(output, DTensor) else []
        seen["local"] = list(local.shape)

    try:
        norm = trainer.model.get_submodule("layers.0.ffn_norm")
    except AttributeError:  # a later pipeline stage does not hold the first block
        return seen
    norm.register_forward_hook(record)
    return seen


def _digests(trainer: LLMTrainer) -> dict[str, str]:
    """SHA-256 of every parameter's local tensor: equal on two ranks only if they hold the same values."""
    digests = {}
    for name, param in trainer.model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        flatten = getattr(local, "__tensor_flatten__", None)  # QLoRA's NF4 weights: codes and scales
        parts = [getattr(local, inner) for inner in flatten()[0]] if flatten is not None else [local]
        digest = hashlib.sha256()
        for part in parts:
            digest.update(part.detach().reshape(-1).view(torch.uint8).numpy().tobytes())  # any dtype
        digests[name] = digest.hexdigest()
    return digests


def _timeout_seconds() -> float:
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    return float(backend.options._timeout.total_seconds())


def _watch_stages(trainer: LLMTrainer) -> dict[str, list[int]]:
    """Pipeline stage index -> batch size of every forward call it will run (empty without pipelining)."""
    stages: dict[str, list[int]] = {}
    if trainer.pipeline is None:
        return stages
    for stage_id, part in zip(trainer.pipeline.stage_ids, trainer.pipeline.parts, strict=True):
        calls = stages.setdefault(str(stage_id), [])
        part.register_forward_pre_hook(lambda module, args, calls=calls: calls.append(args[0].shape[0]))
    return stages


def train(model: str, out: str, overrides: dict[str, str], *, last: bool = True) -> None:
    """Train the tiny ``model`` with ``overrides`` and write this rank's report; ``last`` ends the group."""
    if Path(model).is_absolute() and Path(model).is_dir():  # a transformers model (``hf_models``)
        from tests.support.hf_models import hf_config

        trainer = LLMTrainer(hf_config(Path(model), overrides))
    else:
        trainer = LLMTrainer(tiny_config(model, overrides))
    held = _params(trainer)
    experts = _experts(trainer)
    residual = _watch_residual_norm(trainer)
    stages = _watch_stages(trainer)
    timeouts = [_timeout_seconds()]
    results = trainer.train()
    timeouts.append(_timeout_seconds())
    digests = _digests(trainer)
    rank = trainer.env.rank
    trainer.close(destroy_process_group=last)
    Path(f"{out}.rank{rank}.json").write_text(
        json.dumps(
            {
                "losses": [r.loss for r in results],
                "grad_norms": [r.grad_norm for r in results],
                "extras": [
                    {key: float(value) for key, value in r.extra.items() if not key.startswith("time_")}
                    for r in results
                ],
                "params": held,
                "experts": experts,
                "residual_norm_output": residual,
                "digests": digests,
                "dp_rank": trainer.dp_rank,
                "resumed_from": trainer.resumed_from,
                "timeouts": timeouts,
                "stages": stages,
            }
        )
    )


def grid(world: int, out: str) -> None:
    verdicts: dict[str, str] = {}
    for case in GRID:
        if case.world != world:
            continue
        try:
            trainer = LLMTrainer(grid_config(case))
            trainer.train()
            trainer.close(destroy_process_group=False)
            verdicts[case.name] = "ran"
        except Exception as exc:  # the verdict is what matters; the reason is kept for the report
            verdicts[case.name] = f"rejected: {type(exc).__name__}: {exc}".splitlines()[0]
            if "--trace" in sys.argv:
                traceback.print_exc()
        if dist.is_initialized():  # (a case its config refuses is refused before any process group)
            dist.barrier()
    if int(os.environ["RANK"]) == 0:
        Path(out).write_text(json.dumps(verdicts, indent=1))
    if dist.is_initialized():
        dist.destroy_process_group()


def many(spec: str) -> None:
    runs = json.loads(Path(spec).read_text())
    for i, run in enumerate(runs):
        last = i == len(runs) - 1
        train(run["model"], run["out"], run["overrides"], last=last)
        if not last:
            dist.barrier()  # no rank builds the next run while another still finishes this one


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3], dict(pair.split("=", 1) for pair in sys.argv[4:]))
    elif sys.argv[1] == "many":
        many(sys.argv[2])
    else:
        grid(int(sys.argv[2]), sys.argv[3])
    # gloo threads may outlive the destroyed group; finalising the interpreter with them can abort
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
