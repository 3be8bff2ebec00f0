"""How a PEFT run holds its frozen base: one statement per ``base_dtype`` and part, the answers full
fine-tuning gives, and the torch / torchao behaviour the NF4 base leans on (versions named there)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from hyper_parallel.components.peft import FullFineTuning, LoRA
from hyper_parallel.components.peft.storage import nf4_fits
from hyper_parallel.models import ModelArgs
from hyper_parallel.preflight.model import ParamGroup

PARTS = ("adapted", "embedding", "output", "rest")


@pytest.mark.parametrize(
    ("base", "embeddings", "compute", "held"),
    [
        ("float32", False, "bfloat16", ("float32",) * 4),
        ("bfloat16", False, "bfloat16", ("bfloat16",) * 4),
        ("nf4", False, "bfloat16", ("nf4", "bfloat16", "bfloat16", "bfloat16")),
        ("nf4", True, "float32", ("nf4", "nf4", "nf4", "float32")),
    ],
)
def test_each_base_dtype_holds_each_part_of_the_frozen_base_so(
    base: Any, embeddings: bool, compute: str, held: tuple[str, ...]
) -> None:
    cfg = LoRA.Config(base_dtype=base, quantize_embeddings=embeddings)
    assert tuple(cfg.storage(part, compute) for part in PARTS) == held


def test_a_checkpoint_leaves_out_a_base_the_run_reads_again_or_quantizes() -> None:
    answers = {
        name: (cfg.checkpoint_holds_base(None), cfg.checkpoint_holds_base("/weights"))
        for name, cfg in {
            "full": FullFineTuning.Config(),
            "float32": LoRA.Config(),
            "bfloat16": LoRA.Config(base_dtype="bfloat16"),
            "nf4": LoRA.Config(base_dtype="nf4"),
        }.items()
    }
    assert answers == {
        "full": (True, True),
        "float32": (True, False),
        "bfloat16": (True, False),
        "nf4": (False, False),
    }


def test_an_nf4_weight_fits_in_whole_scale_blocks_and_whole_rows_per_rank() -> None:
    assert nf4_fits((128, 128))  # 16,384 values: one scale block
    assert not nf4_fits((64, 64))
    assert not nf4_fits((128, 128), shards=2)  # half a scale block each
    assert nf4_fits((256, 128), shards=2)
    assert not nf4_fits((3, 16_384 * 3), shards=2)  # whole scale blocks, but not whole rows


def test_full_fine_tuning_answers_every_question_with_nothing_to_do() -> None:
    cfg = FullFineTuning.Config()
    model, args = object(), ModelArgs()
    weights: dict[str, Any] = {"layers.0.wq.weight": 1.0}
    groups = [ParamGroup("attention", (4, 4), linears=("wq",)), ParamGroup("norm", (4,))]
    assert cfg.apply(model, args) is model
    assert cfg.after_load(model, args, seed=0, compute_dtype="bfloat16") is None
    assert cfg.adapter_keys(["layers.0.wq.lora_A", "layers.0.wq.weight"]) == []
    assert cfg.merged(weights, args, "bfloat16", None) is weights
    assert cfg.adapter_folder(weights, lambda w: w) is None
    assert cfg.roles(groups, args, "bfloat16").groups == tuple((g, "trained") for g in groups)
    with pytest.raises(ValueError, match=r"holds LoRA adapters but its config's peft is not LoRA\.Config"):
        cfg.merged({**weights, "layers.0.wq.lora_A": 0.0}, args, "bfloat16", None)


def test_lora_adapts_the_targets_its_model_names_and_counts_their_adapters() -> None:
    class Args(ModelArgs):
        def lora_targets(self) -> frozenset[str]:
            return frozenset({"wq"})

    groups = [ParamGroup("attention", (8, 4), copies=4, linears=("wq", "wk")), ParamGroup("norm", (4,))]
    roles = LoRA.Config(rank=2).roles(groups, Args(), "bfloat16")
    assert roles.adapted == 2
    assert roles.elements("trained") == 2 * (2 * 4 + 8 * 2)  # A (2 x 4) and B (8 x 2) of both wq copies
    assert roles.elements("frozen") == 4 * 32 + 4


@pytest.mark.multiprocess
def test_asking_whether_a_tensor_is_nf4_never_imports_torchao() -> None:
    pytest.importorskip("torch")
    code = (
        "import sys, torch\n"
        "from hyper_parallel.components.peft._base import is_nf4\n"
        "assert not is_nf4(torch.zeros(2))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torchao'))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=300
    )
    assert out.stdout.strip() == "[]"


def _fsdp2_reads_the_nf4_chunk(rank: int) -> None:
    """One rank: a LoRA layer sharded by FSDP2, its weight made NF4 after sharding, then a forward."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from hyper_parallel.components.peft._base import is_nf4, nf4_module

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wq = torch.nn.Linear(128, 256, bias=False)  # 32,768 values: one scale block a rank

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.wq(x)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleDict({"0": Block()})

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layers["0"](x)

    torch.manual_seed(0)
    model = Model()
    whole = model.layers["0"].wq.weight.detach().clone()
    cfg = LoRA.Config(rank=4, targets=("wq",), base_dtype="nf4")
    cfg.apply(model, ModelArgs())
    mesh = init_device_mesh("cpu", (2,))
    fully_shard(model.layers["0"], mesh=mesh)
    fully_shard(model, mesh=mesh)
    weight = model.layers["0"].wq.weight
    shard = weight.to_local()
    cfg.after_load(model, ModelArgs(), seed=0, compute_dtype="float32")
    stored = model.layers["0"].wq.weight
    assert isinstance(stored, DTensor)
    assert is_nf4(stored)
    assert tuple(stored.shape) == (256, 128)
    assert shard.untyped_storage().size() == 0  # the float32 shard is freed at once
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(rank))
    with torch.no_grad():
        out = model(x)  # FSDP2's lazy init re-reads the parameter, then all-gathers the NF4 chunks
    dequantized = nf4_module().to_nf4(whole).get_original_weight()
    assert torch.allclose(out, x @ dequantized.T, atol=1e-5)  # B is zero: the base's output alone


@pytest.mark.multiprocess
def test_fsdp2_all_gathers_the_nf4_chunk_that_replaced_a_freed_float32_shard() -> None:
    """Written against torch 2.13 and torchao 0.18: ``store_base`` puts each rank's NF4 chunk in a new
    ``DTensor`` (``DTensor.from_local``) after FSDP2 sharded the float32 weight, and empties the old
    shard's storage, because FSDP2's lazy initialisation compares the storages of the parameters it
    re-reads and an emptied one (data pointer 0) skips that comparison, which an NF4 tensor (no storage
    of its own) would fail; torchao's ``fsdp_pre_all_gather`` then gathers the codes and scales. A torch or
    torchao release that changes either shows here first."""
    pytest.importorskip("torch")
    pytest.importorskip("torchao")
    from tests.support.processes import spawn

    spawn(_fsdp2_reads_the_nf4_chunk, nprocs=2)
