"""The preflight of a LoRA / QLoRA run: trainable vs frozen parameters and the memory of each.

Only the adapters have gradients and optimizer states; the frozen base is held at its storage dtype
(float32, or NF4 for the adapted layers' weights under ``peft.base_dtype: nf4``). The counts and bytes
equal the tensors of a real trainer after one step (parameters, gradients, AdamW's states) and of every
model family built with adapters; the ``--dry-run`` report prints them.
"""

import io
import warnings
from pathlib import Path
from typing import Any

import pytest

from hyper_parallel.config import ConfigWarning, load_config
from hyper_parallel.launch import main
from hyper_parallel.preflight import estimate
from hyper_parallel.preflight.peft import nf4_bytes

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs" / "qwen3_5_lora_sft_debug.yaml")
LORA = {"peft._target_": "hyper_parallel.components.peft.LoRA.Config"}


def _report(*flags: str) -> list[str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(["--config-file", RECIPE, "--dry-run", "--no-file-checks", *flags], out=out, err=err)
    assert (status, err.getvalue()) == (0, "")
    lines = out.getvalue().splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("preflight:")) :]


def test_the_dry_run_of_the_lora_recipe_counts_trainable_and_frozen_and_their_memory() -> None:
    lines = _report()
    assert lines[2] == (
        "  trainable   145.41 K (145,408): LoRA rank 8 adapters on 31 linear layers; "
        "frozen 2.77 M (2,773,520): the base model, float32"
    )
    assert lines[4:7] == [
        "    parameters      11.1 MiB   float32 adapters 568.0 KiB, frozen float32 base 10.6 MiB, "
        "shard of dp_shard 1 x tp 1",
        "    gradients      568.0 KiB   float32, adapters only; after the peak (one micro batch)",
        "    optimizer        1.1 MiB   AdamW: 2 float32 states, adapters only",
    ]


#: The 31 adapted weights of the recipe's model as NF4: codes (half a byte each), int8 scales per 64, a
#: float32 scale per 16,384, mean and code book each.
ADAPTED_NF4 = 2_621_440 // 2 + 2_621_440 // 64 + 4 * (2_621_440 // 16_384) + 31 * 17 * 4


@pytest.mark.parametrize(
    ("overrides", "in_nf4", "parameters", "frozen_bytes"),
    [
        (
            {"peft.base_dtype": "nf4"},
            "2.62 M (2,621,440) of it in NF4 (the adapted layers' weights)",
            "2.4 MiB   float32 adapters 568.0 KiB, frozen NF4 + float32 base 1.9 MiB",
            ADAPTED_NF4 + 4 * (2_773_520 - 2_621_440),  # the rest in float32, the compute dtype
        ),
        (
            {
                "peft.base_dtype": "nf4",
                "peft.quantize_embeddings": "true",
                "training.mixed_precision_param": "bfloat16",
            },
            "2.75 M (2,752,512) of it in NF4 (the adapted layers' weights and the embeddings)",
            "2.0 MiB   float32 adapters 568.0 KiB, frozen NF4 + bfloat16 base 1.4 MiB",
            # the tied 512 x 256 embedding as NF4 too; the norms and Gated DeltaNet's small tensors in bf16
            ADAPTED_NF4 + nf4_bytes(512 * 256) + 2 * (2_773_520 - 2_752_512),
        ),
    ],
    ids=["nf4", "nf4-embeddings-bf16"],
)
def test_the_dry_run_of_qlora_counts_the_nf4_base_at_half_a_byte_per_weight_and_its_scales(
    overrides: dict[str, str], in_nf4: str, parameters: str, frozen_bytes: int
) -> None:
    lines = _report(*(item for key, value in overrides.items() for item in (f"--{key}", value)))
    assert lines[2] == (
        "  trainable   145.41 K (145,408): LoRA rank 8 adapters on 31 linear layers; "
        f"frozen 2.77 M (2,773,520): the base model, {in_nf4}"
    )
    assert lines[4] == f"    parameters       {parameters}, shard of dp_shard 1 x tp 1"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        est = estimate(load_config(RECIPE, overrides))
    assert est is not None
    assert est.frozen_bytes == frozen_bytes
    assert ADAPTED_NF4 == 1_354_428


def test_nf4_bytes_are_those_of_torchaos_tensor() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao")
    from hyper_parallel.components.peft._base import nf4_module

    for rows, columns in ((128, 256), (768, 256), (64, 512)):
        tensor = nf4_module().to_nf4(torch.randn(rows, columns))
        names, _ = tensor.__tensor_flatten__()
        assert nf4_bytes(rows * columns) == sum(getattr(tensor, name).nbytes for name in names)


def _trainer_config(model: str, extra: dict[str, str]) -> Any:
    from tests.support.trainer import TINY_RUN, debug_config_path

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(debug_config_path(model), {**TINY_RUN, **LORA, "training.max_steps": "1", **extra})


def _bytes(tensor: Any) -> int:
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is not None:  # an NF4 tensor: its codes, scales and code book
        return sum(getattr(tensor, name).nbytes for name in flatten()[0])
    return int(tensor.numel() * tensor.element_size())


NF4 = {"peft.base_dtype": "nf4"}


@pytest.mark.parametrize("model", ["llama3", "qwen3_5"])
@pytest.mark.parametrize(
    "extra",
    [
        {"peft.base_dtype": "float32"},
        {"peft.base_dtype": "bfloat16", "training.mixed_precision_param": "bfloat16"},
        NF4,
        {**NF4, "peft.quantize_embeddings": "true"},
        {**NF4, "training.mixed_precision_param": "bfloat16"},  # the rest of the base stored in bf16
        {**NF4, "peft.quantize_embeddings": "true", "training.mixed_precision_param": "bfloat16"},
    ],
    ids=["float32", "bf16", "nf4", "nf4-embeddings", "nf4-bf16", "nf4-embeddings-bf16"],
)
def test_the_estimate_equals_the_tensors_of_a_trainer_after_one_step(
    model: str, extra: dict[str, str]
) -> None:
    torch = pytest.importorskip("torch")
    if extra["peft.base_dtype"] == "nf4":
        pytest.importorskip("torchao")
    from hyper_parallel.trainer import LLMTrainer

    cfg = _trainer_config(model, extra)
    est = estimate(cfg, 1)
    assert est is not None
    trainer = LLMTrainer(cfg)
    try:
        trainer.train()
        params = list(trainer.model.parameters())
        held = {
            "trainable": sum(p.numel() for p in params if p.requires_grad),
            "frozen": sum(p.numel() for p in params if not p.requires_grad),
            "parameters": sum(_bytes(p) for p in params),
            "frozen_bytes": sum(_bytes(p) for p in params if not p.requires_grad),
            "gradients": sum(_bytes(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(
                _bytes(v)
                for state in trainer.optimizer.state.values()
                for v in state.values()
                if torch.is_tensor(v)
            ),
        }
    finally:
        trainer.close()
    predicted = {
        "trainable": est.trainable,
        "frozen": est.frozen,
        "parameters": est.terms["parameters"],
        "frozen_bytes": est.frozen_bytes,
        "gradients": est.terms["gradients"],
        "optimizer": est.terms["optimizer"],
    }
    assert held == predicted
    assert est.frozen == est.params_total  # the whole base model is frozen


SPECS = {
    "llama3": "hyper_parallel.models.llama3",
    "qwen3_5": "hyper_parallel.models.qwen3_5",
    "qwen3_5_moe": "hyper_parallel.models.qwen3_5_moe",
    "qwen3_5_vl": "hyper_parallel.models.qwen3_5",
}


@pytest.mark.parametrize("model", list(SPECS))
@pytest.mark.parametrize("targets", [(), ("wq", "w2"), ("wv", "w3")])
def test_trainable_and_frozen_counts_equal_the_model_built_with_adapters(
    model: str, targets: tuple[str, ...]
) -> None:
    pytest.importorskip("torch")
    import importlib

    from hyper_parallel.components.peft import LoRA
    from hyper_parallel.trainer.config import TrainerConfig

    module = importlib.import_module(SPECS[model])
    factory = module.create_vl_model_spec if model.endswith("_vl") else module.create_model_spec
    spec = factory("debugmodel")
    peft = LoRA.Config(rank=4, targets=targets)
    est = estimate(TrainerConfig(model=spec, peft=peft), 1)
    assert est is not None
    built = peft.apply(spec.build_model_fn(spec.args, device="meta"), spec.args)
    params = list(built.parameters())
    assert (est.trainable, est.frozen) == (
        sum(p.numel() for p in params if p.requires_grad),
        sum(p.numel() for p in params if not p.requires_grad),
    )
    adapted = {name.rsplit(".", 1)[0] for name, p in built.named_parameters() if p.requires_grad}
    assert est.adapted_layers == len(adapted)
