"""``peft``: LoRA adapters on a frozen model train, shard, resume and export as the ``peft`` library loads.

Tiny Llama 3 and Qwen 3.5 models: a LoRA run starts from the model's own losses (``B`` is zero), trains
only the adapters (the base is bitwise unchanged, the optimizer holds state for the adapters alone), gives
the one-process losses on two processes (FSDP2, DDP, tensor, pipeline and expert parallelism), resumes
exactly (also on two processes from one process's checkpoint), and exports as a
merged Hugging Face model and as a ``peft`` adapter folder that ``PeftModel`` loads to the same logits.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from hyper_parallel.export import ExportError, export_adapter, export_checkpoint, main  # noqa: E402
from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.trainer import (  # noqa: E402
    CHECKPOINTED_AND_COMPILED,
    saving_every_two_steps,
    tiny_config,
    train_runs_under_torchrun,
)

LORA = {
    "peft._target_": "hyper_parallel.components.peft.LoRA.Config",
    "peft.rank": "4",
    "optimizer.lr": "0.01",
}
DATA = {"dataloader.dataset.source": "python_docs"}


def _run(model: str, overrides: dict[str, str]) -> tuple[list[float], Any]:
    """The losses of a tiny run and its trainer (closed; its model and optimizer stay readable)."""
    trainer = LLMTrainer(tiny_config(model, overrides))
    try:
        return [r.loss for r in trainer.train()], trainer
    finally:
        trainer.close()


def test_lora_starts_from_the_model_and_trains_only_the_adapters() -> None:
    full, _ = _run("llama3", {"training.max_steps": "1"})
    trainer = LLMTrainer(tiny_config("llama3", {**LORA, "training.max_steps": "3"}))
    try:
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        losses = [r.loss for r in trainer.train()]
    finally:
        trainer.close()
    assert losses[0] == pytest.approx(full[0], abs=1e-6)  # B = 0: the adapted model is the model
    adapters = {n for n in before if n.endswith((".lora_A", ".lora_B"))}
    assert len(adapters) == 2 * 7 * 2  # A and B of wq wk wv wo w1 w2 w3, in 2 blocks
    params = dict(trainer.model.named_parameters())
    for name, param in params.items():
        assert param.requires_grad is (name in adapters), name
        if name not in adapters:
            assert torch.equal(param, before[name]), name  # the base never moves
    assert all(not torch.equal(params[n], before[n]) for n in adapters if "lora_B" in n)
    with_state = {id(p) for p, state in trainer.optimizer.state.items() if state}
    assert with_state == {id(params[n]) for n in adapters}  # optimizer state for the adapters alone


#: Llama 3's linear layers in the refusals: ours, then Hugging Face's.
LLAMA_LAYERS = (
    "w1, w2, w3, wk, wo, wq, wv, Hugging Face's down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"
)


@pytest.mark.parametrize(
    ("model", "targets", "message"),
    [
        (
            "llama3",
            "[wq, nope]",
            f"'nope' name no linear layer of llama3's blocks; choose among {LLAMA_LAYERS}, or all-linear",
        ),
        (
            "llama3",
            "[in_proj_q]",
            f"'in_proj_q' name no linear layer of llama3's blocks; choose among {LLAMA_LAYERS}, or "
            "all-linear",
        ),
        (
            "llama3",
            "[q_prj]",
            f"'q_prj' name no linear layer of llama3's blocks; choose among {LLAMA_LAYERS}, or all-linear; "
            "did you mean 'q_proj'?",
        ),
        (
            "qwen3_5",
            "[router]",
            "'router' name no linear layer of qwen3_5's blocks; choose among in_proj_a, in_proj_b, "
            "in_proj_k, in_proj_q, in_proj_v, in_proj_z, out_proj, w1, w2, w3, wk, wo, wq, wv, Hugging "
            "Face's down_proj, gate_proj, in_proj_qkv, k_proj, o_proj, q_proj, up_proj, v_proj, or "
            "all-linear",
        ),
    ],
)
def test_a_target_that_names_no_layer_is_refused_at_resolve_time(
    model: str, targets: str, message: str
) -> None:
    from hyper_parallel.config import ConfigError

    with pytest.raises(ConfigError) as caught:
        tiny_config(model, {**LORA, "peft.targets": targets})
    assert [(i.path, i.message) for i in caught.value.issues] == [("peft.targets", message)]


#: Llama 3.2's tied embeddings (one matrix for the embeddings and the output projection).
TIED = {"model.overrides.tie_word_embeddings": "true"}
TWO = {
    "llama3-dp_shard2": ("llama3", {"parallelism.dp_shard": "2"}),
    "qwen3_5-dp_shard2": ("qwen3_5", {"parallelism.dp_shard": "2"}),
    "llama3-tp2": ("llama3", {"parallelism.dp_shard": "1", "parallelism.tp": "2"}),
    "qwen3_5-tp2": ("qwen3_5", {"parallelism.dp_shard": "1", "parallelism.tp": "2"}),
    "llama3-pp2": ("llama3", {"parallelism.dp_shard": "1", "parallelism.pp": "2"}),
    "llama3-ddp2": ("llama3", {"parallelism.dp_shard": "1", "parallelism.dp_replicate": "2"}),
    "llama3_tied-dp_shard2": ("llama3", {**TIED, "parallelism.dp_shard": "2"}),
    "llama3_tied-tp2": ("llama3", {**TIED, "parallelism.dp_shard": "1", "parallelism.tp": "2"}),
}
#: LoRA over a bfloat16 base (computing in bfloat16): FSDP2, tensor and pipeline parallelism hold it so.
BF16_BASE = {"peft.base_dtype": "bfloat16", "training.mixed_precision_param": "bfloat16"}
TWO_BF16 = {
    "qwen3_5-dp_shard2-bf16": ("qwen3_5", {**BF16_BASE, "parallelism.dp_shard": "2"}),
    "llama3-tp2-bf16": ("llama3", {**BF16_BASE, "parallelism.dp_shard": "1", "parallelism.tp": "2"}),
    "llama3-pp2-bf16": ("llama3", {**BF16_BASE, "parallelism.dp_shard": "1", "parallelism.pp": "2"}),
}
#: The router's load-balancing loss is a statistic of each rank's own tokens (as in the peers), so
#: two processes give one process's losses only without it.
NO_AUX = {"model.overrides.router_aux_loss_coef": "0.0"}
#: Expert parallelism (the routed experts are never adapted) against FSDP2 on the same two processes.
MOE = {
    "qwen3_5_moe-dp_shard2": ("qwen3_5_moe", {**NO_AUX, "parallelism.dp_shard": "2"}),
    "qwen3_5_moe-ep2": ("qwen3_5_moe", {**NO_AUX, "parallelism.dp_shard": "2", "parallelism.ep": "2"}),
}


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_two_processes_give_the_one_process_lora_losses(tmp_path: Path) -> None:
    layouts = {**TWO, **MOE, **TWO_BF16}
    runs = {name: (model, {**DATA, **LORA, **layout}) for name, (model, layout) in layouts.items()}
    # Across layouts: one process trains 4 steps saving at 2; two processes (FSDP2) resume its step 2.
    saving = {
        **saving_every_two_steps(tmp_path / "ckpt"),
        "training.max_steps": "4",
        "checkpoint.keep_latest_k": "0",  # step 2 stays beside step 4
    }
    straight, _ = _run("qwen3_5", {**DATA, **LORA, **saving})
    shutil.rmtree(tmp_path / "ckpt" / "step-4")
    runs["qwen3_5-resumed-dp_shard2"] = ("qwen3_5", {**DATA, **LORA, **saving, "parallelism.dp_shard": "2"})
    reports, _ = train_runs_under_torchrun(2, tmp_path, runs)
    for report in reports["qwen3_5-resumed-dp_shard2"]:
        assert report["resumed_from"] == 2
        assert report["losses"] == pytest.approx(straight[2:], abs=1e-5)
    moe_alone, _ = _run("qwen3_5_moe", {**DATA, **LORA, **NO_AUX})
    for rank in range(2):
        ep, plain = reports["qwen3_5_moe-ep2"][rank], reports["qwen3_5_moe-dp_shard2"][rank]
        assert ep["losses"] == pytest.approx(plain["losses"], abs=1e-6, rel=0)
        assert ep["losses"] == pytest.approx(moe_alone, abs=1e-5)  # and both give one process's
    for name, (model, _layout) in TWO.items():
        expected, _ = _run(model, {**DATA, **LORA, **(TIED if "tied" in name else {})})
        for report in reports[name]:
            assert report["losses"] == pytest.approx(expected, abs=1e-5), name
        held = reports[name][0]["params"]
        adapters = [n for n in held if n.endswith(".lora_A")]
        assert adapters, name
        if "dp_shard" in name:
            assert all(held[n]["dtensor"] for n in adapters), name  # FSDP2 shards them with their block
    for name, (model, _layout) in TWO_BF16.items():
        expected, _ = _run(model, {**DATA, **LORA, **BF16_BASE})
        for report in reports[name]:  # autocast's and FSDP2's bf16 casts round apart (6e-4 at most)
            assert report["losses"] == pytest.approx(expected, abs=5e-3), name
            dtypes = {n: p["local_dtype"] for n, p in report["params"].items()}
            assert {d for n, d in dtypes.items() if "lora_" in n} == {"torch.float32"}, name
            assert {d for n, d in dtypes.items() if "lora_" not in n} == {"torch.bfloat16"}, name


def test_a_lora_run_resumes_exactly(tmp_path: Path) -> None:
    saving = {
        **LORA,
        **saving_every_two_steps(tmp_path / "ckpt"),
        "training.max_steps": "4",
        "checkpoint.keep_latest_k": "0",  # step 2 stays beside step 4
    }
    straight, _ = _run("qwen3_5", saving)
    shutil.rmtree(tmp_path / "ckpt" / "step-4")
    resumed, trainer = _run("qwen3_5", saving)
    assert trainer.resumed_from == 2
    assert resumed == straight[2:]  # bitwise: adapters, their optimizer state, data and RNG came back


def test_a_bfloat16_base_is_held_saved_and_merged_in_bf16_and_resumes_exactly(tmp_path: Path) -> None:
    from hyper_parallel.components.checkpoint._safe_read import inspect

    saving = {
        **LORA,
        **BF16_BASE,
        **saving_every_two_steps(tmp_path / "ckpt"),
        "training.max_steps": "4",
        "checkpoint.keep_latest_k": "0",  # step 2 stays beside step 4
    }
    straight, trainer = _run("qwen3_5", saving)  # the debug model's tied embeddings
    params = dict(trainer.model.named_parameters())
    assert {p.dtype for p in params.values() if not p.requires_grad} == {torch.bfloat16}
    assert {p.dtype for p in params.values() if p.requires_grad} == {torch.float32}  # the adapters
    assert trainer.model.output.weight is trainer.model.tok_embeddings.weight
    saved = inspect(tmp_path / "ckpt" / "step-4").metadata.state_dict_metadata
    assert (
        saved["model.layers.0.feed_forward.w1.weight"].properties.dtype == torch.bfloat16
    )  # the base, as held
    assert saved["model.layers.0.feed_forward.w1.lora_A"].properties.dtype == torch.float32
    merged = export_checkpoint(tmp_path / "ckpt", tmp_path / "merged")
    from safetensors.torch import load_file

    exported = load_file(merged / "model.safetensors")["model.layers.0.mlp.gate_proj.weight"]
    layer = trainer.model.get_submodule("layers.0.feed_forward.w1")
    with torch.no_grad():
        expected = layer.weight.float() + 16.0 / 4 * layer.lora_B @ layer.lora_A  # in float32, as trained
    assert exported.dtype == torch.float32
    assert float((exported - expected).abs().max()) <= 1e-6
    shutil.rmtree(tmp_path / "ckpt" / "step-4")
    resumed, trainer = _run("qwen3_5", saving)
    assert trainer.resumed_from == 2
    assert resumed == straight[2:]  # bitwise: the bf16 base, adapters, optimizer state, data and RNG
    from hyper_parallel.evaluate import evaluate

    held_out = {**saving, "validator.dataset.source": "synthetic", "validator.steps": "4"}  # as it trained on
    evaluated = evaluate(tiny_config("qwen3_5", held_out), checkpoint=tmp_path / "ckpt")  # under autocast
    assert evaluated["loss"] == pytest.approx(resumed[-1], rel=0.05)


def test_a_bfloat16_base_computing_in_float32_is_refused() -> None:
    from hyper_parallel.config import ConfigError

    with pytest.raises(ConfigError) as caught:
        tiny_config(
            "llama3", {**LORA, "peft.base_dtype": "bfloat16", "training.mixed_precision_param": "float32"}
        )
    assert [(i.path, i.message) for i in caught.value.issues] == [
        (
            "peft.base_dtype",
            "'bfloat16' holds the frozen base in the dtype the run computes it in, which must then be "
            "bfloat16: set training.mixed_precision_param to bfloat16, got 'float32'",
        )
    ]


@pytest.mark.parametrize("model", ["llama3", "qwen3_5"])  # Qwen 3.5's debug model ties its embeddings
def test_a_lora_run_from_weights_path_checkpoints_its_adapters_alone_and_resumes_exactly(
    tmp_path: Path, model: str
) -> None:
    from hyper_parallel.components.checkpoint._safe_read import inspect

    _run(model, {"training.max_steps": "1", "checkpoint.enable": "true", "checkpoint.folder": str(tmp_path)})
    base = export_checkpoint(tmp_path, tmp_path.parent / f"{tmp_path.name}-base")
    saving = {
        **LORA,
        **saving_every_two_steps(tmp_path / "ckpt"),
        "training.max_steps": "4",
        "checkpoint.keep_latest_k": "0",  # step 2 stays beside step 4
        "model.weights_path": str(base),
        "tokenizer._target_": "hyper_parallel.components.tokenizer.ByteTokenizer.Config",
    }
    straight, trainer = _run(model, saving)
    adapters = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert len(adapters) == 2 * (7 * 2 if model == "llama3" else 7 + 8)  # Qwen: full + linear attention
    keys = set(inspect(tmp_path / "ckpt" / "step-2").metadata.state_dict_metadata)
    assert {k.removeprefix("model.") for k in keys if k.startswith("model.")} == adapters  # no frozen base
    states = {k for k in keys if k.startswith("optimizer.state.")}
    assert states == {f"optimizer.state.{n}.{s}" for n in adapters for s in ("exp_avg", "exp_avg_sq", "step")}
    shutil.rmtree(tmp_path / "ckpt" / "step-4")
    resumed, trainer = _run(model, saving)  # the base comes from weights_path again
    assert trainer.resumed_from == 2
    assert resumed == straight[2:]


@pytest.fixture(scope="module", params=["llama3", "qwen3_5"])
def lora_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A base exported from a 1-step run, then LoRA trained from it for 3 steps with checkpoints."""
    model = request.param
    tmp = tmp_path_factory.mktemp(f"lora-{model}")
    ckpt = {"checkpoint.enable": "true"}
    _run(model, {**ckpt, "training.max_steps": "1", "checkpoint.folder": str(tmp / "base-ckpt")})
    base = export_checkpoint(tmp / "base-ckpt", tmp / "base")
    over = {
        **ckpt,
        **LORA,
        "training.max_steps": "3",
        "checkpoint.folder": str(tmp / "ckpt"),
        "model.weights_path": str(base),
        "tokenizer._target_": "hyper_parallel.components.tokenizer.ByteTokenizer.Config",
    }
    _, trainer = _run(model, over)
    return {"tmp": tmp, "base": base, "ckpt": tmp / "ckpt", "ours": trainer.model.eval()}


def _ids() -> Any:
    return torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))


def test_the_merged_export_and_the_peft_adapter_give_the_trained_logits(lora_run: dict[str, Any]) -> None:
    tmp = lora_run["tmp"]
    merged = export_checkpoint(lora_run["ckpt"], tmp / "merged")
    adapter = export_adapter(lora_run["ckpt"], tmp / "adapter")
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 16.0)
    assert config["base_model_name_or_path"] == str(lora_run["base"])
    base = transformers.AutoModelForCausalLM.from_pretrained(lora_run["base"]).eval()
    loaded = peft.PeftModel.from_pretrained(base, adapter).eval()
    hf = transformers.AutoModelForCausalLM.from_pretrained(merged).eval()
    plain = transformers.AutoModelForCausalLM.from_pretrained(lora_run["base"]).eval()
    ids = _ids()
    with torch.no_grad():
        ours, merged_logits = lora_run["ours"](ids), hf(ids).logits
        assert float((ours - merged_logits).abs().max()) <= 1e-4
        assert float((loaded(ids).logits - merged_logits).abs().max()) <= 1e-4
        assert float((plain(ids).logits - merged_logits).abs().max()) > 1e-2  # the adapters did something


def test_the_command_line_writes_the_adapter_folder(lora_run: dict[str, Any], capsys: Any) -> None:
    out = lora_run["tmp"] / "cli-adapter"
    assert main([str(lora_run["ckpt"]), str(out), "--adapter-only"]) == 0
    expected = f"exported {lora_run['ckpt']} to {out}: adapter_config.json, adapter_model.safetensors\n"
    assert capsys.readouterr().out == expected


def test_a_run_without_lora_has_no_adapter_to_export(tmp_path: Path, capsys: Any) -> None:
    _run(
        "llama3", {"training.max_steps": "1", "checkpoint.enable": "true", "checkpoint.folder": str(tmp_path)}
    )
    with pytest.raises(ExportError):
        export_adapter(tmp_path, tmp_path.parent / "adapter")
    assert main([str(tmp_path), str(tmp_path.parent / "adapter"), "--adapter-only"]) == 2
    message = (
        f"export: '{tmp_path / 'step-1'}' was trained without LoRA (peft): it holds no adapters to export\n"
    )
    assert capsys.readouterr().err == message


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq = torch.nn.Linear(6, 5, bias=False)
        self.other = torch.nn.Linear(5, 5, bias=False)

    def forward(self, x: Any) -> Any:
        return self.other(self.wq(x))


@pytest.mark.parametrize(
    ("model", "targets", "layers"),
    [
        ("llama3", "[q_proj, v_proj]", {"wq", "wv"}),
        ("llama3", "[gate_proj, up_proj, down_proj, o_proj, k_proj]", {"w1", "w3", "w2", "wo", "wk"}),
        ("llama3", "[all-linear]", {"wq", "wk", "wv", "wo", "w1", "w2", "w3"}),
        ("qwen3_5", "[in_proj_qkv, out_proj, wq]", {"in_proj_q", "in_proj_k", "in_proj_v", "out_proj", "wq"}),
        (
            "qwen3_5",
            "[all-linear]",
            {"wq", "wk", "wv", "wo", "w1", "w2", "w3", "out_proj", *(f"in_proj_{p}" for p in "qkvzab")},
        ),
    ],
)
def test_hugging_face_names_and_all_linear_adapt_the_layers_they_name(
    model: str, targets: str, layers: set[str]
) -> None:
    cfg = tiny_config(model, {**LORA, "peft.targets": targets})
    assert cfg.peft.layer_names(cfg.model.args) == layers
    built = cfg.model.build_model_fn(cfg.model.args, device="meta")
    cfg.peft.apply(built, cfg.model.args)
    adapted = {name.split(".")[-2] for name, _ in built.named_parameters() if name.endswith(".lora_A")}
    assert adapted == layers  # never the output head, the router or a routed expert


def test_the_hugging_face_names_are_those_the_weight_adapters_rename() -> None:
    from hyper_parallel.models.llama3 import _runtime as llama3
    from hyper_parallel.models.qwen3_5 import _runtime as qwen3_5

    for model, runtime in (("llama3", llama3), ("qwen3_5", qwen3_5)):
        args = tiny_config(model, {}).model.args
        renamed: dict[str, set[str]] = {}
        for hf, ours in runtime._IN_LAYER.items():
            renamed.setdefault(hf.split(".")[-2], set()).add(ours.split(".")[-2])
        for fused, parts in getattr(runtime, "_FUSED", {}).items():
            if fused.endswith("_proj_qkv.weight"):
                renamed[fused.split(".")[-2]] = {part.split(".")[-2] for part in parts}
        for hf, ours in args.hf_linear_names().items():
            assert renamed[hf] == ours, (model, hf)
        linears = args.block_linear_names()
        assert {hf for hf, ours in renamed.items() if ours <= linears and {hf} != ours} == set(
            args.hf_linear_names()
        )


def test_all_linear_is_listed_alone() -> None:
    from hyper_parallel.config import ConfigError

    with pytest.raises(ConfigError) as caught:
        tiny_config("llama3", {**LORA, "peft.targets": "[all-linear, wq]"})
    assert [(i.path, i.message) for i in caught.value.issues] == [
        ("peft.targets", "'all-linear' names every linear layer of the blocks: list it alone")
    ]


def test_rank_alpha_dropout_and_targets_shape_what_an_adapter_adds() -> None:
    from hyper_parallel.components.peft import LoRA
    from hyper_parallel.models import ModelArgs

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleDict({"0": _Block()})
    LoRA.Config(rank=3, alpha=6.0, dropout=0.5, targets=("wq",)).apply(model, ModelArgs())
    block = model.layers["0"]
    assert (block.wq.lora_A.shape, block.wq.lora_B.shape) == ((3, 6), (5, 3))
    assert not hasattr(block.other, "lora_A")  # only the targets are adapted
    with torch.no_grad():
        block.wq.lora_A.normal_(generator=torch.Generator().manual_seed(1))
        block.wq.lora_B.normal_(generator=torch.Generator().manual_seed(2))
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(3))
    expected = block.other(x @ block.wq.weight.T + 2.0 * (x @ block.wq.lora_A.T @ block.wq.lora_B.T))
    model.eval()  # no dropout; the scale is alpha / rank = 2
    assert torch.allclose(block(x), expected, atol=1e-6)
    model.train()
    torch.manual_seed(0)
    assert not torch.allclose(block(x), expected, atol=1e-3)  # dropout on the adapter's input


def test_generate_works_from_the_checkpoint_the_merged_export_and_base_plus_adapter(
    lora_run: dict[str, Any],
) -> None:
    from hyper_parallel.generate import generate_text, load_model

    tmp = lora_run["tmp"]
    merged = export_checkpoint(lora_run["ckpt"], tmp / "merged-gen")
    adapter = export_adapter(lora_run["ckpt"], tmp / "adapter-gen")
    from_ckpt = generate_text(load_model(lora_run["ckpt"]), "def ", max_new_tokens=8)
    assert generate_text(load_model(merged), "def ", max_new_tokens=8) == from_ckpt
    base = transformers.AutoModelForCausalLM.from_pretrained(lora_run["base"]).eval()
    loaded = peft.PeftModel.from_pretrained(base, adapter).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(merged)
    prompt = tokenizer("def ", return_tensors="pt")
    with torch.no_grad():
        out = loaded.generate(**prompt, max_new_tokens=8, do_sample=False)
        logits = transformers.AutoModelForCausalLM.from_pretrained(merged).eval()(out).logits[0]
    start = prompt["input_ids"].shape[1]
    assert out.shape[1] == start + 8 or out[0, -1].item() == tokenizer.eos_token_id
    for t in range(start - 1, out.shape[1] - 1):  # greedy: each token the merged model's best (ties aside)
        assert float(logits[t].max() - logits[t, out[0, t + 1]]) <= 1e-4, t


def test_activation_checkpointing_and_compile_give_the_same_lora_losses() -> None:
    plain, _ = _run("llama3", {**DATA, **LORA, "training.max_steps": "3"})
    wrapped, _ = _run("llama3", {**DATA, **LORA, "training.max_steps": "3", **CHECKPOINTED_AND_COMPILED})
    assert wrapped == pytest.approx(plain, abs=1e-6)


def test_the_lora_sft_recipe_learns_the_answers(tmp_path: Path) -> None:
    import random
    import warnings

    from hyper_parallel.config import ConfigWarning, load_config
    from tests.support.prepared import run_prepare
    from tests.support.trainer import ROOT

    debug = ROOT / "configs" / "qwen3_5_debug.yaml"  # the recipe's model, as shipped: its base
    based = {"training.max_steps": "1", "checkpoint.enable": "true", "checkpoint.folder": str(tmp_path)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        quiet = {"metrics.enable_jsonl": "false", "~metrics.jsonl_path": None}  # the sink off, with its path
        pretrain = LLMTrainer(load_config(debug, {**based, **quiet}))
    try:
        pretrain.train()
    finally:
        pretrain.close()
    base = export_checkpoint(tmp_path, tmp_path / "base")
    words = ["apple", "river", "stone", "cloud", "green", "light", "table", "music"]
    pick = random.Random(0)
    with (tmp_path / "chat.jsonl").open("w") as out:
        for _ in range(200):
            word = pick.choice(words)
            chat = [{"role": "user", "content": f"Spell {word} backwards."}]
            out.write(json.dumps({"messages": [*chat, {"role": "assistant", "content": word[::-1]}]}) + "\n")
    recipe = ROOT / "configs" / "qwen3_5_lora_sft_debug.yaml"
    status, _, err = run_prepare(
        "prepare",
        tmp_path / "chat.jsonl",
        "--format",
        "chat",
        "--output",
        tmp_path / "chat",
        "--config-file",
        recipe,
    )
    assert status == 0, err
    overrides = {
        "model.weights_path": str(base),
        "dataloader.dataset.source": "tokenized",
        "dataloader.dataset.paths": f"[{tmp_path / 'chat'}]",
        "checkpoint.folder": str(tmp_path / "lora"),
        "metrics.enable_jsonl": "false",
        "~metrics.jsonl_path": None,  # an option of a sink that is off is refused
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        trainer = LLMTrainer(load_config(recipe, overrides))
    try:
        losses = [r.loss for r in trainer.train()]
    finally:
        trainer.close()
    assert type(trainer.config.peft).__qualname__ == "LoRA.Config"
    assert losses[-1] <= 0.8 * losses[0], losses  # the answer tokens' loss: only they carry labels


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_four_processes_under_hsdp_give_the_one_process_lora_losses(tmp_path: Path) -> None:
    """HSDP (2 replicas x 2 shards): the adapters shard with their blocks inside a replica, replicate
    across replicas, and the losses are one process's."""
    one_each = {"training.micro_batch_size": "1"}  # the 4 sequences of a step, one per rank
    hsdp = {**one_each, "parallelism.dp_replicate": "2", "parallelism.dp_shard": "2"}
    reports, _ = train_runs_under_torchrun(4, tmp_path, {"hsdp": ("llama3", {**DATA, **LORA, **hsdp})})
    expected, _ = _run("llama3", {**DATA, **LORA, **one_each})
    for report in reports["hsdp"]:
        assert report["losses"] == pytest.approx(expected, abs=1e-5)
    held = reports["hsdp"][0]["params"]
    adapters = [n for n in held if n.endswith((".lora_A", ".lora_B"))]
    assert len(adapters) == 2 * 7 * 2
    for name in adapters:  # replicated across the replicas, sharded on dim 0 inside one
        assert (held[name]["mesh"], held[name]["placements"]) == (
            ["dp_replicate", "dp_shard"],
            ["Replicate()", "Shard(dim=0)"],
        ), name
    digests = [r["digests"] for r in reports["hsdp"]]
    assert digests[0] == digests[2]  # the replicas agree after training
    assert digests[1] == digests[3]
