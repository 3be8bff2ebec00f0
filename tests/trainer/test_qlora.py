"""QLoRA (``peft.base_dtype: nf4``): LoRA over a frozen base stored as torchao's NF4 tensors.

Small Llama 3 and Qwen 3.5 debug models (two blocks; Llama's feed-forward rounded to 128 so that every
weight is whole NF4 scale blocks on two ranks): the adapted layers' weights become NF4 and never change,
the adapters learn, FSDP2 on two processes gives the one-process losses, a checkpoint holds the adapters
and their optimizer state alone and resumes exactly (the base is built and quantized again), the export
writes the dequantized base with the adapters merged, and what cannot run is refused at ``--dry-run``.
"""

from __future__ import annotations

import io
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")
transformers = pytest.importorskip("transformers")

from hyper_parallel.components.peft._base import is_nf4  # noqa: E402
from hyper_parallel.config import ConfigWarning, load_config  # noqa: E402
from hyper_parallel.export import export_checkpoint  # noqa: E402
from hyper_parallel.launch import main  # noqa: E402
from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.trainer import (  # noqa: E402
    CHECKPOINTED_AND_COMPILED,
    TINY_RUN,
    debug_config_path,
    saving_every_two_steps,
    train_runs_under_torchrun,
)

QLORA = {
    "peft._target_": "hyper_parallel.components.peft.LoRA.Config",
    "peft.rank": "4",
    "peft.base_dtype": "nf4",
    "optimizer.lr": "0.01",
    "dataloader.dataset.source": "python_docs",
}
#: Two blocks of each debug model, its other sizes as shipped (every argument the multi-process worker's
#: tiny models change, set back); Llama's feed-forward width a multiple of 128 (768: 12 scale blocks).
SMALL = {
    "llama3": {
        "model.overrides.dim": "256",
        "model.overrides.n_layers": "2",
        "model.overrides.n_heads": "8",
        "model.overrides.n_kv_heads": "4",
        "model.overrides.multiple_of": "128",
    },
    "qwen3_5": {
        "model.overrides.dim": "256",
        "model.overrides.n_layers": "2",
        "model.overrides.full_attention_interval": "2",
        "model.overrides.ffn_hidden_dim": "512",
        "model.overrides.n_heads": "4",
        "model.overrides.n_kv_heads": "2",
        "model.overrides.head_dim": "64",
        "model.overrides.linear_num_key_heads": "4",
        "model.overrides.linear_num_value_heads": "8",
        "model.overrides.linear_key_head_dim": "32",
        "model.overrides.linear_value_head_dim": "32",
    },
}


def _overrides(model: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**TINY_RUN, **SMALL[model], **QLORA, **(extra or {})}


def _config(model: str, extra: dict[str, str] | None = None) -> Any:
    with warnings.catch_warnings():  # a short run logs no metrics on purpose
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(debug_config_path(model), _overrides(model, extra))


def _run(model: str, extra: dict[str, str] | None = None) -> tuple[list[float], Any]:
    trainer = LLMTrainer(_config(model, extra))
    try:
        return [r.loss for r in trainer.train()], trainer
    finally:
        trainer.close()


def _inner(weight: Any) -> dict[str, Any]:
    names, _ = weight.__tensor_flatten__()
    return {name: getattr(weight, name).clone() for name in names}


@pytest.mark.parametrize("model", ["llama3", "qwen3_5"])
@pytest.mark.parametrize("embeddings", [False, True])
def test_qlora_trains_the_adapters_over_a_frozen_nf4_base(model: str, embeddings: bool) -> None:
    extra = {"training.max_steps": "8", **(NF4_EMBEDDINGS if embeddings else {})}
    trainer = LLMTrainer(_config(model, extra))
    try:
        adapted = {
            name: module
            for name, module in trainer.model.named_modules()
            if isinstance(module, torch.nn.Linear) and hasattr(module, "lora_A")
        }
        nf4 = {name: p for name, p in trainer.model.named_parameters() if is_nf4(p)}
        before = {name: _inner(weight) for name, weight in nf4.items()}
        losses = [r.loss for r in trainer.train()]
    finally:
        trainer.close()
    assert sum(losses[-3:]) / 3 < 0.97 * sum(losses[:3]) / 3, losses  # it learns
    assert len(adapted) == (14 if model == "llama3" else 15)  # 7 per Llama block; Qwen: 5 + 3, 4 + 3
    embedding_names = (
        {"tok_embeddings.weight", "output.weight"} if model == "llama3" else {"tok_embeddings.weight"}
    )
    assert set(nf4) == {f"{name}.weight" for name in adapted} | (embedding_names if embeddings else set())
    for name, weight in nf4.items():
        assert not weight.requires_grad, name
        after = _inner(weight)
        assert all(torch.equal(after[k], v) for k, v in before[name].items()), name  # never moves
    params = dict(trainer.model.named_parameters())
    trained = {n for n, p in params.items() if p.requires_grad}
    assert trained == {f"{name}.{part}" for name in adapted for part in ("lora_A", "lora_B")}
    with_state = {id(p) for p, state in trainer.optimizer.state.items() if state}
    assert with_state == {id(params[n]) for n in trained}


def test_the_nf4_base_holds_at_most_0_3x_the_bytes_of_a_bfloat16_one() -> None:
    """Resident bytes of the adapted layers' weights on the Qwen 3.5 debug model (all four blocks)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        cfg = load_config(debug_config_path("qwen3_5"), {**TINY_RUN, **QLORA, "training.max_steps": "1"})
    trainer = LLMTrainer(cfg)
    try:
        weights = [p for p in trainer.model.parameters() if is_nf4(p)]
        held = sum(t.nbytes for p in weights for t in _inner(p).values())
        bf16 = sum(2 * p.numel() for p in weights)
    finally:
        trainer.close()
    assert sum(p.numel() for p in weights) == 2_621_440
    assert held / bf16 <= 0.3
    assert held == 1_354_428  # the preflight's figure (tests/preflight/test_peft.py)


NF4_EMBEDDINGS = {"peft.quantize_embeddings": "true"}
BF16 = {"training.mixed_precision_param": "bfloat16"}


@pytest.mark.parametrize(
    ("model", "extra", "ratio"),
    [
        ("llama3", BF16, 0.3193),  # the embedding and the output projection in bf16: 0.32x
        ("qwen3_5", BF16, 0.2990),
        ("llama3", NF4_EMBEDDINGS, 0.2595),  # the norms in float32 (the compute dtype)
        ("qwen3_5", NF4_EMBEDDINGS, 0.2715),
        ("llama3", {**NF4_EMBEDDINGS, **BF16}, 0.2588),
        ("qwen3_5", {**NF4_EMBEDDINGS, **BF16}, 0.2639),
    ],
)
def test_the_whole_frozen_base_is_nf4_and_the_compute_dtype(
    model: str, extra: dict[str, str], ratio: float
) -> None:
    """Resident bytes of every frozen parameter of the debug models (all blocks) over the same base in
    bf16: the adapted weights (with ``quantize_embeddings`` the embeddings too) NF4, the rest in the
    compute dtype; at most 0.3x with NF4 embeddings, as the preflight counts it."""
    from hyper_parallel.preflight import estimate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        cfg = load_config(debug_config_path(model), {**TINY_RUN, **QLORA, "training.max_steps": "1", **extra})
    trainer = LLMTrainer(cfg)
    try:
        frozen = [p for p in trainer.model.parameters() if not p.requires_grad]
        compute = torch.bfloat16 if extra.get("training.mixed_precision_param") else torch.float32
        embedding = trainer.model.tok_embeddings
        held = sum(sum(t.nbytes for t in _inner(p).values()) if is_nf4(p) else p.nbytes for p in frozen)
        bf16 = sum(2 * p.numel() for p in frozen)
        dtypes = {p.dtype for p in frozen if not is_nf4(p)}
    finally:
        trainer.close()
    assert dtypes == {compute}
    assert is_nf4(embedding.weight) == ("peft.quantize_embeddings" in extra)
    assert type(embedding).__name__ == ("NF4Embedding" if is_nf4(embedding.weight) else "Embedding")
    assert trainer.model.output.weight is embedding.weight or model == "llama3"  # Qwen's stay tied
    assert held / bf16 == pytest.approx(ratio, abs=5e-5)
    est = estimate(cfg, 1)
    assert est is not None
    assert est.frozen_bytes == held


def test_an_nf4_embedding_looks_up_the_rows_of_its_dequantized_table() -> None:
    trainer = LLMTrainer(_config("qwen3_5", {**NF4_EMBEDDINGS, "training.max_steps": "1"}))
    trainer.close()
    embedding = trainer.model.tok_embeddings
    ids = torch.tensor([[0, 5, 511, 5], [17, 3, 3, 256]])
    table = embedding.weight.get_original_weight()
    assert torch.equal(embedding(ids), table[ids])
    from hyper_parallel.export import _rebuilt_base

    drawn = _rebuilt_base(trainer.config)["tok_embeddings.weight"]  # the float32 table before quantization
    error = float((table - drawn).abs().max())
    assert 0 < error < 0.1 * float(drawn.abs().max())


def _saving(folder: Path) -> dict[str, str]:
    return {
        **saving_every_two_steps(folder),
        "training.max_steps": "4",
        "checkpoint.keep_latest_k": "0",  # step 2 stays beside step 4
    }


def _stored_keys(step: Path) -> set[str]:
    from hyper_parallel.components.checkpoint._safe_read import inspect

    return set(inspect(step).metadata.state_dict_metadata)


def test_a_qlora_checkpoint_holds_the_adapters_alone_and_resumes_exactly(tmp_path: Path) -> None:
    saving = _saving(tmp_path / "ckpt")
    straight, trainer = _run("llama3", saving)
    adapters = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    keys = _stored_keys(tmp_path / "ckpt" / "step-2")
    assert {k.removeprefix("model.") for k in keys if k.startswith("model.")} == adapters
    states = {k for k in keys if k.startswith("optimizer.state.")}
    assert states == {f"optimizer.state.{n}.{s}" for n in adapters for s in ("exp_avg", "exp_avg_sq", "step")}
    shutil.rmtree(tmp_path / "ckpt" / "step-4")
    resumed, trainer = _run("llama3", saving)
    assert trainer.resumed_from == 2
    assert resumed == straight[2:]  # bitwise: the same NF4 base, adapters, optimizer state, data, RNG


@pytest.mark.parametrize("embeddings", [False, True])
def test_the_export_of_a_qlora_run_is_the_dequantized_base_with_the_adapters_merged(
    tmp_path: Path, embeddings: bool
) -> None:
    saving = {"checkpoint.enable": "true", "checkpoint.folder": str(tmp_path / "ckpt")}
    _, trainer = _run("llama3", {**saving, **(NF4_EMBEDDINGS if embeddings else {})})
    merged = export_checkpoint(tmp_path / "ckpt", tmp_path / "merged")
    hf = transformers.AutoModelForCausalLM.from_pretrained(merged).eval()
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours, theirs = trainer.model.eval()(ids), hf(ids).logits
    assert float((ours - theirs).abs().max()) <= 1e-4
    exported = hf.model.layers[0].self_attn.o_proj.weight  # wo: rows as ours (wq's are permuted for RoPE)
    layer = trainer.model.layers["0"].attention.wo
    with torch.no_grad():
        expected = layer.weight.get_original_weight() + 16.0 / 4 * layer.lora_B @ layer.lora_A
    assert float((exported - expected).abs().max()) <= 1e-6
    from hyper_parallel.generate import generate_text, load_model

    from_ckpt = generate_text(load_model(tmp_path / "ckpt"), "def ", max_new_tokens=8)
    assert generate_text(load_model(merged), "def ", max_new_tokens=8) == from_ckpt


def test_the_export_of_a_bf16_qlora_run_holds_the_base_as_the_run_held_it(tmp_path: Path) -> None:
    """Rounded to bf16 where the run held bf16 (the embedding), NF4's values where it held NF4."""
    from safetensors.torch import load_file

    saving = {"checkpoint.enable": "true", "checkpoint.folder": str(tmp_path / "ckpt"), **BF16}
    _, trainer = _run("llama3", {**saving, "training.max_steps": "2"})
    exported = load_file(export_checkpoint(tmp_path / "ckpt", tmp_path / "merged") / "model.safetensors")
    embedding = trainer.model.tok_embeddings.weight
    assert embedding.dtype == torch.bfloat16
    assert torch.equal(exported["model.embed_tokens.weight"], embedding.float())
    layer = trainer.model.layers["0"].attention.wo
    with torch.no_grad():
        held = layer.weight.get_original_weight().to(torch.bfloat16).float()
        expected = held + 16.0 / 4 * layer.lora_B @ layer.lora_A
    assert float((exported["model.layers.0.self_attn.o_proj.weight"] - expected).abs().max()) <= 1e-6


def test_activation_checkpointing_and_compile_give_the_same_qlora_losses() -> None:
    plain, _ = _run("llama3", {"training.max_steps": "3", **NF4_EMBEDDINGS})
    wrapped, _ = _run("llama3", {"training.max_steps": "3", **NF4_EMBEDDINGS, **CHECKPOINTED_AND_COMPILED})
    assert wrapped == pytest.approx(plain, abs=1e-6)


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_fsdp2_on_two_processes_gives_the_one_process_qlora_losses_and_resumes_on_one(tmp_path: Path) -> None:
    saving = _saving(tmp_path / "ckpt")
    extras = {
        "llama3": ("llama3", {}),
        "qwen3_5": ("qwen3_5", NF4_EMBEDDINGS),
        "qwen3_5_bf16": ("qwen3_5", BF16),
    }
    runs = {
        name: (model, {**_overrides(model, extra), "parallelism.dp_shard": "2"})
        for name, (model, extra) in extras.items()
    }
    runs["llama3"][1].update(saving)  # its checkpoint resumes on one process below
    reports, _ = train_runs_under_torchrun(2, tmp_path / "runs", runs)
    for name, (model, extra) in extras.items():
        expected, _ = _run(model, extra)
        # float32: the one-process losses; bf16: FSDP2's casts round otherwise than autocast's
        tolerance = 2e-2 if extra is BF16 else 1e-5
        for report in reports[name]:
            assert report["losses"] == pytest.approx(expected, abs=tolerance), name
        held = reports[name][0]["params"]
        w1 = held["layers.0.feed_forward.w1.weight"]
        assert (w1["local_type"], w1["placements"], w1["local"]) == (
            "NF4Tensor",
            ["Shard(dim=0)"],
            [384, 256] if model == "llama3" else [256, 256],
        )
        embedding = held["tok_embeddings.weight"]
        assert (embedding["local_type"], embedding["local_dtype"], embedding["local"]) == (
            ("NF4Tensor", "torch.float32", [256, 256])
            if extra is NF4_EMBEDDINGS
            else ("Tensor", "torch.bfloat16" if extra is BF16 else "torch.float32", [256, 256])
        )
        norm = held["norm.weight"]
        assert norm["local_dtype"] == ("torch.bfloat16" if extra is BF16 else "torch.float32")
    shutil.rmtree(tmp_path / "ckpt" / "step-4")
    resumed, trainer = _run("llama3", saving)  # the two ranks' adapters and optimizer state, on one
    assert trainer.resumed_from == 2
    assert resumed == pytest.approx(reports["llama3"][0]["losses"][2:], abs=1e-5)


OFFLOAD = ("--training.enable_cpu_offload", "true")


def _dry_run(*flags: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    argv = ["--config-file", str(debug_config_path("llama3")), "--dry-run"]
    qlora = ["--peft._target_", QLORA["peft._target_"], "--peft.base_dtype", "nf4"]
    status = main([*argv, *qlora, *flags], out=out, err=err)
    return status, err.getvalue()


def _refused(degree: str, reason: str, value: int = 2) -> str:
    return (
        f"--parallelism.{degree}: peft.base_dtype 'nf4' runs on one process or with FSDP2 over dp_shard "
        f"alone: {reason}; set parallelism.{degree} to 1 or peft.base_dtype to 'float32', got {value}"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--parallelism.tp", "2"],
            _refused("tp", "torchao's NF4 tensor cannot be split by tensor parallelism"),
        ),
        (["--parallelism.pp", "2"], _refused("pp", "pipeline parallelism is not supported with it yet")),
        (
            ["--parallelism.dp_replicate", "2"],
            _refused(
                "dp_replicate",
                "torch's FSDP2 does not all-gather an NF4 tensor it replicates (DDP), and torchao's NF4 "
                "all-gather has one mesh dimension (not HSDP's two)",
            ),
        ),
        (
            ["--model.overrides.dim", "64", "--model.overrides.n_heads", "4"],
            "--peft.base_dtype: 'nf4' stores a weight in blocks of 64 values with one scale per 256 blocks, "
            "so its size must be a multiple of 16,384; not so for wq (64 x 64 = 4,096), wk (64 x 64 = "
            "4,096), wv (64 x 64 = 4,096), wo (64 x 64 = 4,096), w1 (192 x 64 = 12,288), w3 (192 x 64 = "
            "12,288), w2 (64 x 192 = 12,288): leave them out of peft.targets, or use 'float32'",
        ),
        (
            ["--peft.quantize_embeddings", "true", "--model.overrides.vocab_size", "520"],
            "--peft.base_dtype: 'nf4' stores a weight in blocks of 64 values with one scale per 256 blocks, "
            "so its size must be a multiple of 16,384; not so for tok_embeddings (520 x 256 = 133,120), "
            "output (520 x 256 = 133,120): set peft.quantize_embeddings to false, or use 'float32'",
        ),
        (
            [
                *("--peft.quantize_embeddings", "true", "--peft.targets", "[wq]"),
                *("--model.overrides.dim", "64", "--model.overrides.n_heads", "4"),
                *("--model.overrides.vocab_size", "520"),
            ],
            "--peft.base_dtype: 'nf4' stores a weight in blocks of 64 values with one scale per 256 blocks, "
            "so its size must be a multiple of 16,384; not so for tok_embeddings (520 x 64 = 33,280), wq "
            "(64 x 64 = 4,096), output (520 x 64 = 33,280): leave the layers out of peft.targets, set "
            "peft.quantize_embeddings to false, or use 'float32'",
        ),
        (
            ["--parallelism.dp_shard", "2"],
            "--parallelism.dp_shard: with peft.base_dtype 'nf4' each of the 2 ranks holds whole rows and "
            "whole scale blocks (16,384 values) of every NF4 weight; not so for w1 (704 x 256), w3 "
            "(704 x 256), w2 (256 x 704); use a dp_shard that divides them, got 2",
        ),
        (
            [*("--parallelism.dp_shard", "2", "--model.overrides.multiple_of", "128"), *OFFLOAD],
            "--training.enable_cpu_offload: peft.base_dtype 'nf4' does not offload its NF4 weights to the "
            "host yet; set it to false",
        ),
    ],
)
def test_what_qlora_cannot_run_is_refused_at_dry_run(flags: list[str], message: str) -> None:
    assert _dry_run(*flags) == (2, f"{message}\n1 problem found; nothing was started.\n")


def test_nf4_embeddings_without_an_nf4_base_are_refused_at_dry_run() -> None:
    out, err = io.StringIO(), io.StringIO()
    argv = [
        "--config-file",
        str(debug_config_path("llama3")),
        "--dry-run",
        "--peft._target_",
        QLORA["peft._target_"],
    ]
    assert main([*argv, "--peft.quantize_embeddings", "true"], out=out, err=err) == 2
    assert err.getvalue() == (
        "--peft.quantize_embeddings: true stores the embeddings as NF4, which needs base_dtype 'nf4', got "
        "'float32'\n1 problem found; nothing was started.\n"
    )


def test_an_automatic_dp_shard_that_splits_a_scale_block_is_refused_once_the_world_size_is_known() -> None:
    status, err = _dry_run(
        "--model.overrides.multiple_of", "128", "--parallelism.dp_shard", "-1", "--world-size", "4"
    )
    assert status == 2
    assert (
        "--parallelism.dp_shard: with peft.base_dtype 'nf4' each of the 4 ranks holds whole rows and "
        "whole scale blocks (16,384 values) of every NF4 weight; not so for wk (128 x 256), wv "
        "(128 x 256); use a dp_shard that divides them, got 4\n"
    ) in err


def test_nf4_without_torchao_is_refused_at_dry_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else find_spec(name, *a)
    )
    assert _dry_run() == (
        2,
        "--peft.base_dtype: 'nf4' needs torchao, which is not installed: pip install "
        "'hyper-parallel[qlora]' (torchao==0.18.0), or use 'float32'\n"
        "1 problem found; nothing was started.\n",
    )


def test_the_torchao_release_named_in_messages_is_the_one_the_extras_pin() -> None:
    from hyper_parallel.components.peft import TORCHAO_VERSION

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    qlora = next(line for line in text.splitlines() if line.startswith("qlora = "))
    models_test = next(line for line in text.splitlines() if line.startswith("models-test = "))
    assert qlora == f'qlora = ["torchao=={TORCHAO_VERSION}"]'
    assert f'"torchao=={TORCHAO_VERSION}"' in models_test
