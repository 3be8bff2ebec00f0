"""Point 3 of the preflight: per-rank parameter, gradient and optimizer bytes equal what a run holds.

Two gloo processes under torchrun build each debug model (vocabularies of odd size, so FSDP2 and TP
split some tensors unevenly), apply the model's own ``parallelize`` (FSDP2 over ``dp_shard`` 2, or TP 2),
take one AdamW step and write the bytes of their local shards; rank 0's must equal the estimate exactly
(rank 0 holds the largest shard) and rank 1's may only be smaller. LoRA cases add adapters to the frozen
model (tensor parallelism splits a column-wise layer's adapters with it), QLoRA's base is NF4 under FSDP2.
"""

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from hyper_parallel.components.peft import LoRA
from hyper_parallel.models import llama3, qwen3_5
from hyper_parallel.models.spec import ModelSpec
from hyper_parallel.preflight import estimate
from hyper_parallel.trainer.config import ParallelismConfig, TrainerConfig, TrainingConfig
from tests.support.processes import torchrun

WORLD = 2
SPECS = {
    "llama3": lambda: llama3.create_model_spec("debugmodel", overrides={"vocab_size": 2051}),
    "qwen3_5": lambda: qwen3_5.create_model_spec(
        "debugmodel", overrides={"vocab_size": 2051, "tie_word_embeddings": False}
    ),
    "qwen3_5_tied": lambda: qwen3_5.create_model_spec("debugmodel", overrides={"vocab_size": 2051}),
    "qwen3_5_vl": lambda: qwen3_5.create_vl_model_spec("debugmodel", overrides={"text.vocab_size": 2051}),
}
#: LoRA runs: only the adapters have gradients and optimizer states; QLoRA's base is NF4 (FSDP2 alone).
PEFT = {
    "llama3_lora": ("llama3", LoRA.Config(rank=4)),
    "qwen3_5_lora": ("qwen3_5", LoRA.Config(rank=4, targets=("wq", "in_proj_z", "w2"))),
    "qwen3_5_qlora": ("qwen3_5", LoRA.Config(rank=4, base_dtype="nf4")),
}
LAYOUTS = {
    "dp_shard2": ParallelismConfig(dp_shard=2),
    "tp2": ParallelismConfig(dp_shard=1, tp=2),
}
CASES = [
    ("llama3", "dp_shard2"),
    ("llama3", "tp2"),
    ("qwen3_5", "dp_shard2"),
    ("qwen3_5", "tp2"),
    ("qwen3_5_tied", "dp_shard2"),
    ("qwen3_5_vl", "dp_shard2"),
    ("llama3_lora", "dp_shard2"),
    ("llama3_lora", "tp2"),
    ("qwen3_5_lora", "tp2"),
    ("qwen3_5_qlora", "dp_shard2"),
]


def _spec_and_peft(name: str) -> tuple[ModelSpec, LoRA.Config | None]:
    model, peft = PEFT.get(name, (name, None))
    return SPECS[model](), peft


def _local_bytes(tensor: Any) -> int:
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    flatten = getattr(local, "__tensor_flatten__", None)
    if flatten is not None:  # an NF4 tensor: its codes, scales and code book
        return sum(int(getattr(local, name).nbytes) for name in flatten()[0])
    return int(local.numel() * local.element_size())


def _worker(out_dir: str) -> None:
    """One torchrun rank: every case in turn, bytes of the local shards to ``out_dir/<case>.<rank>.json``."""
    import torch
    import torch.distributed as dist

    from hyper_parallel.parallel.parallel_dims import ParallelDims

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        for model_name, layout in CASES:
            torch.manual_seed(0)
            spec, peft = _spec_and_peft(model_name)
            parallelism = LAYOUTS[layout]
            model = spec.build_model_fn(spec.args, device="cpu")
            if peft is not None:
                model = peft.apply(model, spec.args)
            spec.parallelize_fn(
                model, parallelism, ParallelDims.from_config(parallelism, WORLD).build_mesh("cpu")
            )
            if peft is not None:  # the compute dtype _config gives
                peft.after_load(model, spec.args, seed=0, compute_dtype="float32")
            text = getattr(spec.args, "text", spec.args)
            ids = torch.randint(0, text.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
            optimizer = torch.optim.AdamW(
                [p for p in model.parameters() if p.requires_grad], lr=1e-3, foreach=False
            )
            if text is spec.args:
                logits = model(ids)
            else:  # one image of 4 x 4 patches, merged into 4 placeholder tokens: the vision tower trains too
                vision = spec.args.vision
                ids[:, 3:7] = 5
                pixels = torch.randn(
                    16, vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
                )
                logits = model(ids, pixels, torch.tensor([[1, 4, 4]]), image_token_id=5)
            logits.float().square().mean().backward()
            optimizer.step()
            params = list(model.parameters())
            held = {
                "parameters": sum(_local_bytes(p) for p in params),
                "gradients": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
                "optimizer": sum(
                    _local_bytes(value)
                    for state in optimizer.state.values()
                    for value in state.values()
                    if isinstance(value, torch.Tensor)
                ),
            }
            Path(out_dir, f"{model_name}.{layout}.{rank}.json").write_text(json.dumps(held))
            dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("shards")
    done = torchrun(WORLD, __file__, str(out), timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def _config(
    spec: ModelSpec, parallelism: ParallelismConfig, peft: LoRA.Config | None = None
) -> TrainerConfig:
    extra = {"peft": peft} if peft is not None else {}
    return TrainerConfig(
        model=spec,
        parallelism=parallelism,
        # float32 compute, as the worker runs (QLoRA's frozen rest is stored in it)
        training=TrainingConfig(global_batch_size=2, seq_len=16, mixed_precision_param="float32"),
        **extra,
    )


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("model_name", "layout"), CASES)
def test_sharded_bytes_equal_the_local_shards_of_a_two_process_run(
    held: Path, model_name: str, layout: str
) -> None:
    spec, peft = _spec_and_peft(model_name)
    est = estimate(_config(spec, LAYOUTS[layout], peft), WORLD)
    assert est is not None
    predicted = {term: est.terms[term] for term in ("parameters", "gradients", "optimizer")}
    rank0 = json.loads((held / f"{model_name}.{layout}.0.json").read_text())
    rank1 = json.loads((held / f"{model_name}.{layout}.1.json").read_text())
    assert rank0 == predicted
    assert all(rank1[term] <= rank0[term] for term in predicted)


def test_a_run_without_sharding_holds_the_whole_model() -> None:
    spec = SPECS["llama3"]()
    est = estimate(_config(spec, ParallelismConfig(dp_shard=1)), 1)
    assert est is not None
    numel = est.params_total
    tensors = 2 + 9 * spec.args.num_layers() + 1  # embedding, output, 9 per block, final norm
    assert est.terms["parameters"] == est.terms["gradients"] == 4 * numel
    assert est.terms["optimizer"] == 2 * 4 * numel + 4 * tensors  # exp_avg, exp_avg_sq, a float32 step each


if __name__ == "__main__":
    _worker(sys.argv[1])
