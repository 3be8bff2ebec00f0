"""transformers' causal LMs through ``hyper_parallel.models.hf.create_model_spec``, on four architectures.

Each architecture (Mistral, Qwen 3, Gemma 3, Phi-3) is written tiny by transformers itself into the test's
folder. One process trains it: step 1's loss is transformers' own loss on the same batch (fp32, 1e-5), a
resume from step 2 repeats steps 3 and 4 exactly, the export loads in transformers as the same class with
our logits (1e-5), and ``generate`` from the checkpoint decodes what transformers' greedy search does.
Checkpointed and compiled layers, and two processes under FSDP2 or tensor parallelism (LoRA under tensor
parallelism, QLoRA under FSDP2 too), give the same losses; LoRA by Hugging Face names exports an adapter
``PeftModel`` loads with our logits, and so does QLoRA over its NF4 base as the run held it. Packed
documents give the logits each document gives alone; the preflight counts the built model's parameters
exactly and its FLOPs within 5% of ``FlopCounterMode``. A folder that needs remote code, an unknown
``model_type`` and a misspelt override are refused in one line; tensor parallelism is refused at
``--dry-run``.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hyper_parallel.config import ConfigError  # noqa: E402
from hyper_parallel.export import export_checkpoint  # noqa: E402
from hyper_parallel.models.hf import create_model_spec  # noqa: E402
from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.hf_models import ARCHITECTURES, hf_config, write_tiny_model  # noqa: E402
from tests.support.hub import COMMIT, hub_cache  # noqa: E402
from tests.support.trainer import saving_every_two_steps  # noqa: E402

pytestmark = pytest.mark.timeout(300)

RUN = {
    "dataloader.dataset.source": "python_docs",
    "training.global_batch_size": "2",
    "training.micro_batch_size": "2",
    "training.seq_len": "64",  # step 1's second row packs two documents
}

#: A tiny Mistral whose MLP layers (QLoRA's targets) are whole NF4 scale blocks (64 x 256 values) on each of
#: two ranks.
NF4_SIZES = {"hidden_size": 128, "intermediate_size": 256, "num_key_value_heads": 4, "head_dim": 32}
QLORA = {
    "peft._target_": "hyper_parallel.components.peft.LoRA.Config",
    "peft.rank": "4",
    "peft.base_dtype": "nf4",
    "peft.targets": "[gate_proj, up_proj, down_proj]",
    "optimizer.lr": "0.01",
    "training.max_steps": "3",
}


def _train(config: Any) -> tuple[list[float], list[Any], Any]:
    """Losses of every step, every micro batch the model was given, and the trained model (eval)."""
    trainer = LLMTrainer(config)
    seen: list[Any] = []
    forward = trainer.forward
    trainer.forward = lambda batch: (seen.append(dict(batch)), forward(batch))[1]  # type: ignore[method-assign]
    try:
        losses = [r.loss for r in trainer.train()]
        return losses, seen, trainer.model.eval()
    finally:
        trainer.close()


def _positions(documents: Any) -> Any:
    from hyper_parallel.models.hf._module import document_positions

    return None if documents is None else document_positions(documents)


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_a_transformers_model_trains_resumes_and_exports_as_transformers_runs_it(
    model_type: str, tmp_path: Path
) -> None:
    folder = write_tiny_model(model_type, tmp_path / model_type)
    saving = saving_every_two_steps(tmp_path / "ckpt")
    losses, seen, ours = _train(hf_config(folder, {**RUN, **saving}))

    # step 1: transformers' own loss of the same batch, from the same folder
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    batch = seen[0]
    documents = batch["document_ids"]
    assert [int((row[1:] != row[:-1]).sum()) for row in documents] == [0, 1]  # packed: two documents
    with torch.no_grad():
        # transformers keeps the packed documents apart (from the position ids) when it builds no cache
        expected = reference(
            input_ids=batch["input_ids"],
            position_ids=_positions(documents),
            labels=batch["labels"],
            use_cache=False,
        ).loss
    assert losses[0] == pytest.approx(float(expected), abs=1e-5)

    # resume from step 2: steps 3 and 4 again, exactly
    (tmp_path / "again").mkdir()
    shutil.copytree(tmp_path / "ckpt" / "step-2", tmp_path / "again" / "step-2")
    resumed = LLMTrainer(hf_config(folder, {**RUN, **saving_every_two_steps(tmp_path / "again")}))
    try:
        assert resumed.resumed_from == 2
        assert [r.loss for r in resumed.train()] == pytest.approx(losses[2:], abs=1e-6)
    finally:
        resumed.close()

    # the export: transformers loads it as the same class, with the trained weights
    out = export_checkpoint(tmp_path / "ckpt", tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == model_type
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(loaded) is type(reference)
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert float((ours(ids) - loaded(ids).logits).abs().max()) <= 1e-5

    # generate from the checkpoint: transformers' greedy continuation of the exported model
    from hyper_parallel.generate import load_model
    from hyper_parallel.models import generate_ids

    prompt = [5, 17, 99, 3, 250]
    decoded = generate_ids(load_model(tmp_path / "ckpt").model, prompt, max_new_tokens=8)
    with torch.no_grad():
        greedy = loaded.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None)
    assert decoded == greedy[0, len(prompt) :].tolist()


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_packed_documents_give_the_logits_each_gives_alone(model_type: str, tmp_path: Path) -> None:
    from hyper_parallel.models import load_pretrained

    spec = create_model_spec(path=str(write_tiny_model(model_type, tmp_path / model_type)))
    model = spec.build_model_fn(spec.args, device="meta")
    load_pretrained(model, spec, device="cpu")
    ids = torch.randint(0, 512, (1, 20), generator=torch.Generator().manual_seed(1))
    documents = torch.tensor([[0] * 7 + [1] * 3 + [2] * 10])
    with torch.no_grad():
        packed = model(ids, document_ids=documents)
        alone = torch.cat([model(ids[:, :7]), model(ids[:, 7:10]), model(ids[:, 10:])], dim=1)
    assert float((packed - alone).abs().max()) <= 1e-5


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_the_preflight_counts_the_built_model_exactly_and_its_flops_within_5_percent(
    model_type: str, tmp_path: Path
) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    from hyper_parallel.preflight.model import parameter_total

    folder = write_tiny_model(model_type, tmp_path / model_type)
    spec = create_model_spec(path=str(folder))
    # eager attention: FlopCounterMode does not count the CPU kernels of SDPA, only matmuls
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    costs = spec.args.preflight()
    assert parameter_total(costs) == sum(p.numel() for p in reference.parameters())
    seq = 64
    ids = torch.randint(0, 512, (1, seq))
    with FlopCounterMode(display=False) as counter:
        reference(input_ids=ids, labels=ids).loss.backward()
    measured = counter.get_total_flops() / seq
    assert costs.flop_count(seq).total == pytest.approx(measured, rel=0.05)


def _folder(tmp_path: Path, **config: Any) -> str:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_a_folder_that_needs_remote_code_is_refused_in_one_line(tmp_path: Path) -> None:
    path = _folder(tmp_path, model_type="mistral", auto_map={"AutoModelForCausalLM": "x.Model"})
    with pytest.raises(ValueError, match="trust_remote_code") as caught:
        create_model_spec(path=path)
    assert str(caught.value) == (
        f"{path}/config.json: names code of its own (auto_map), which would need trust_remote_code; this "
        "project never runs code from a model folder"
    )


def test_an_unknown_model_type_is_refused_with_the_closest_known_one(tmp_path: Path) -> None:
    path = _folder(tmp_path, model_type="mistrall")
    with pytest.raises(ValueError, match="mistrall") as caught:
        create_model_spec(path=path)
    assert str(caught.value) == (
        f"{path}/config.json: model_type 'mistrall' is not a model transformers "
        f"{transformers.__version__} knows; did you mean 'mistral'?"
    )


def test_an_override_its_config_class_lacks_is_refused_at_its_key_with_a_did_you_mean(tmp_path: Path) -> None:
    folder = write_tiny_model("mistral", tmp_path / "mistral")
    with pytest.raises(ConfigError) as caught:
        hf_config(folder, model="  overrides: {num_hiden_layers: 1}\n")
    (issue,) = caught.value.issues
    assert issue.path == "model.overrides.num_hiden_layers"
    assert (
        issue.message
        == "'num_hiden_layers' is not a field of MistralConfig; did you mean 'num_hidden_layers'?"
    )


def test_overrides_change_the_built_model(tmp_path: Path) -> None:
    folder = write_tiny_model("mistral", tmp_path / "mistral")
    cfg = hf_config(folder, {"model.init": "random"}, model="  overrides: {num_hidden_layers: 1}\n")
    assert cfg.model.args.num_layers() == 1
    assert cfg.model.weights_path is None
    assert not any(".layers.1." in name for name in cfg.model.args.parameter_shapes())


def test_tensor_parallelism_that_the_models_plan_cannot_split_is_refused_with_the_reason(
    tmp_path: Path,
) -> None:
    folder = write_tiny_model("mistral", tmp_path / "mistral")
    overrides = {"parallelism.tp": "4", "parallelism.dp_shard": "1", "parallelism.sequence_parallel": "false"}
    with pytest.raises(ConfigError) as caught:
        hf_config(folder, overrides)
    messages = {issue.path: issue.message for issue in caught.value.issues}
    assert messages["parallelism.tp"] == (
        "must divide the model's 4 attention heads and 2 key/value heads, got 4 (model_type 'mistral'); set "
        "parallelism.tp to 1"
    )
    with pytest.raises(ConfigError) as caught:
        hf_config(folder, {**overrides, "parallelism.tp": "2", "parallelism.sequence_parallel": "true"})
    messages = {issue.path: issue.message for issue in caught.value.issues}
    assert messages["parallelism.sequence_parallel"] == (
        "is not supported yet by hf (its tensor-parallel plan keeps activations replicated); set it to false"
    )


def test_qlora_under_tensor_parallelism_is_refused_with_the_reason(tmp_path: Path) -> None:
    """LoRA splits with the model's plan (tested on two processes below); an NF4 base cannot."""
    folder = write_tiny_model("mistral", tmp_path / "mistral", **NF4_SIZES)
    tp = {"parallelism.tp": "2", "parallelism.dp_shard": "1", "parallelism.sequence_parallel": "false"}
    with pytest.raises(ConfigError) as caught:
        hf_config(folder, {**QLORA, **tp})
    messages = {issue.path: issue.message for issue in caught.value.issues}
    assert messages == {
        "parallelism.tp": "peft.base_dtype 'nf4' runs on one process or with FSDP2 over dp_shard alone: "
        "torchao's NF4 tensor cannot be split by tensor parallelism; set parallelism.tp to 1 or "
        "peft.base_dtype to 'float32', got 2"
    }


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_two_processes_under_fsdp2_or_the_models_tp_plan_give_one_process_losses(tmp_path: Path) -> None:
    """FSDP2 with checkpointed layers (Qwen 3: tied embeddings, the tie survives sharding), FSDP2 over Gemma 3
    (scaled embeddings, sliding-window layers) and Phi-3 (fused projections), and tensor
    parallelism by each model's ``base_model_tp_plan``: Mistral (colwise / rowwise), Phi-3 (its fused
    projections gathered: ``colwise_gather_output`` / ``rowwise_split_input``), Qwen 3 and Gemma 3 (their
    query/key norms ``replicated_with_grad_allreduce``); with LoRA adapters under
    tensor parallelism (Mistral: split with the layers they adapt) and QLoRA under FSDP2 (an NF4 Mistral)."""
    from tests.support.trainer import train_runs_under_torchrun

    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is required")
    pytest.importorskip("torchao")
    run = {**RUN, "training.global_batch_size": "4", "training.micro_batch_size": "2"}
    tp = {"parallelism.tp": "2", "parallelism.sequence_parallel": "false"}
    lora = {
        "peft._target_": "hyper_parallel.components.peft.LoRA.Config",
        "peft.rank": "4",
        "optimizer.lr": "0.01",
    }
    # run name -> (model_type, its folder's sizes, the run's overrides on one process, the layout on two)
    layouts: dict[str, tuple[str, dict[str, Any], dict[str, str], dict[str, str]]] = {
        "qwen3": ("qwen3", {}, {}, {"parallelism.dp_shard": "2", "activation_checkpoint.mode": "full"}),
        "gemma3_text": ("gemma3_text", {}, {}, {"parallelism.dp_shard": "2"}),
        "phi3-fsdp": ("phi3", {}, {}, {"parallelism.dp_shard": "2"}),
        "mistral": ("mistral", {}, {}, tp),
        "phi3": ("phi3", {}, {}, tp),
        "qwen3-tp": ("qwen3", {}, {}, tp),
        "gemma3_text-tp": ("gemma3_text", {}, {}, tp),
        "mistral-lora": ("mistral", {}, {**lora, "peft.targets": "[q_proj, o_proj]"}, tp),
        "mistral-qlora": ("mistral", NF4_SIZES, QLORA, {"parallelism.dp_shard": "2"}),
    }
    folders = {
        name: write_tiny_model(model_type, tmp_path / name, **sizes)
        for name, (model_type, sizes, _, _) in layouts.items()
    }
    one = {name: {**run, **overrides} for name, (_, _, overrides, _) in layouts.items()}
    runs = {name: (str(folders[name]), {**one[name], **layout}) for name, (*_, layout) in layouts.items()}
    reports = train_runs_under_torchrun(2, tmp_path / "runs", runs)[0]
    for name, ranks in reports.items():
        expected, _, _ = _train(hf_config(folders[name], one[name]))
        for report in ranks:
            assert report["losses"] == pytest.approx(expected, abs=1e-5), name
    layer = "causal_lm.model.layers.0.self_attn.{}.weight"
    sharded = reports["qwen3"][0]["params"][layer.format("q_proj")]
    assert (sharded["mesh"], sharded["placements"]) == (["dp_shard"], ["Shard(dim=0)"])
    assert sharded["local"][0] * 2 == sharded["global"][0]
    assert [r["dp_rank"] for r in reports["qwen3"]] == [0, 1]
    for name in ("gemma3_text", "phi3-fsdp"):
        held = reports[name][0]["params"][layer.format("o_proj")]
        assert (held["mesh"], held["placements"]) == (["dp_shard"], ["Shard(dim=0)"]), name
    split = {
        ("mistral", "q_proj.weight"): "Shard(dim=0)",
        ("mistral", "o_proj.weight"): "Shard(dim=1)",
        ("phi3", "qkv_proj.weight"): "Shard(dim=0)",
        ("phi3", "o_proj.weight"): "Shard(dim=1)",
        ("qwen3-tp", "k_proj.weight"): "Shard(dim=0)",
        ("qwen3-tp", "q_norm.weight"): "Replicate()",  # replicated_with_grad_allreduce
        ("gemma3_text-tp", "o_proj.weight"): "Shard(dim=1)",
        ("gemma3_text-tp", "k_norm.weight"): "Replicate()",
        # a column-wise layer's adapters are split on their rows with it; a row-wise one's replicated
        ("mistral-lora", "q_proj.lora_A"): "Shard(dim=0)",
        ("mistral-lora", "q_proj.lora_B"): "Shard(dim=0)",
        ("mistral-lora", "o_proj.lora_A"): "Replicate()",
        ("mistral-lora", "o_proj.lora_B"): "Replicate()",
    }
    attention = "causal_lm.model.layers.0.self_attn."
    for (name, param), placement in split.items():
        held = reports[name][0]["params"][attention + param]
        assert (held["mesh"], held["placements"]) == (["tp"], [placement]), (name, param)
    norm = reports["mistral"][0]["params"]["causal_lm.model.norm.weight"]
    assert (norm["mesh"], norm["placements"]) == (["tp"], ["Replicate()"])
    gate = reports["mistral-qlora"][0]["params"]["causal_lm.model.layers.0.mlp.gate_proj.weight"]
    assert (gate["placements"], gate["local_type"], gate["local"]) == (
        ["Shard(dim=0)"],
        "NF4Tensor",
        [128, 128],
    )


@pytest.mark.parametrize(
    ("model_type", "targets", "expected"),
    [
        ("mistral", "[q_proj, v_proj]", {"q_proj", "v_proj"}),
        ("phi3", "[all-linear]", {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}),
        ("qwen3", "[q_proj, k_proj, v_proj, o_proj]", {"q_proj", "k_proj", "v_proj", "o_proj"}),
        (
            "gemma3_text",
            "[all-linear]",
            {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
        ),
    ],
)
def test_lora_by_hugging_face_names_exports_an_adapter_peft_loads_with_our_logits(
    model_type: str, targets: str, expected: set[str], tmp_path: Path
) -> None:
    peft = pytest.importorskip("peft")
    from hyper_parallel.export import export_adapter

    folder = write_tiny_model(model_type, tmp_path / model_type)
    lora = {
        "peft._target_": "hyper_parallel.components.peft.LoRA.Config",
        "peft.rank": "4",
        "peft.targets": targets,
        "optimizer.lr": "0.01",
        "checkpoint.enable": "true",
        "checkpoint.folder": str(tmp_path / "ckpt"),
        "training.max_steps": "3",
    }
    losses, _, ours = _train(hf_config(folder, {**RUN, **lora}))
    assert losses[-1] < losses[0]
    adapter = export_adapter(tmp_path / "ckpt", tmp_path / "adapter")
    config = json.loads((adapter / "adapter_config.json").read_text())
    layers = config["target_modules"]  # transformers' module names, every layer's
    assert {name.rsplit(".", 1)[-1] for name in layers} == expected
    assert len(layers) == 2 * len(expected)
    assert all(name.startswith("model.layers.") for name in layers)
    base = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    loaded = peft.PeftModel.from_pretrained(base, adapter).eval()
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert float((ours(ids) - loaded(ids).logits).abs().max()) <= 1e-4


def test_qlora_trains_over_an_nf4_base_and_its_adapter_loads_in_peft_with_our_logits(tmp_path: Path) -> None:
    """Gemma 3 with NF4 embeddings (its scaled embedding, tied to the output head): the adapted layers' and
    the embeddings' weights are NF4 and never train; the adapter folder over the base as the run held it
    (each of those weights NF4's values) gives our logits and the merged export's (1e-4)."""
    peft = pytest.importorskip("peft")
    pytest.importorskip("torchao")
    from hyper_parallel.components.peft._base import is_nf4, nf4_module
    from hyper_parallel.export import export_adapter

    folder = write_tiny_model("gemma3_text", tmp_path / "gemma3", **NF4_SIZES)
    saving = {"checkpoint.enable": "true", "checkpoint.folder": str(tmp_path / "ckpt")}
    embeddings = {"peft.quantize_embeddings": "true"}
    losses, _, ours = _train(hf_config(folder, {**RUN, **QLORA, **embeddings, **saving}))
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0]
    nf4 = {name for name, p in ours.named_parameters() if is_nf4(p)}
    assert nf4 == {"causal_lm.model.embed_tokens.weight"} | {
        f"causal_lm.model.layers.{i}.mlp.{layer}.weight"
        for i in range(2)
        for layer in ("gate_proj", "up_proj", "down_proj")
    }
    assert ours.causal_lm.lm_head.weight is ours.causal_lm.model.embed_tokens.weight  # still tied
    assert {n for n, p in ours.named_parameters() if p.requires_grad} == {
        name.replace(".weight", part)
        for name in nf4 - {"causal_lm.model.embed_tokens.weight"}
        for part in (".lora_A", ".lora_B")
    }
    adapter = export_adapter(tmp_path / "ckpt", tmp_path / "adapter")
    merged = export_checkpoint(tmp_path / "ckpt", tmp_path / "merged")
    base = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in base.named_parameters():
            if "causal_lm." + name in nf4:
                param.copy_(nf4_module().to_nf4(param.detach().contiguous()).get_original_weight())
    loaded = peft.PeftModel.from_pretrained(base, adapter).eval()
    exported = transformers.AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = ours(ids)
        assert float((loaded(ids).logits - logits).abs().max()) <= 1e-4
        assert float((exported(ids).logits - logits).abs().max()) <= 1e-4


def test_bench_models_trains_the_transformers_path_as_the_bare_loop_and_the_native_llama_do() -> None:
    """``python -m bench models``' trainer rows on a tiny Llama 3 shape: the transformers path through the
    trainer gives the losses of the bare transformers loop it is timed against (with document masking: both
    keep the documents apart; without), and the native Llama 3 on the same weights gives them too (1e-5)."""
    import time

    from bench.hf_path import ROWS, trainer_rows

    tiny = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "multiple_of": 32}
    rows = trainer_rows(1, 1, 1, time.process_time, shape=tiny)
    assert [row["name"] for row in rows] == list(ROWS)
    for row in rows:
        assert row["max_loss_diff"] <= 1e-5, row


def test_the_weights_check_refuses_overrides_that_change_shapes_and_takes_the_others(tmp_path: Path) -> None:
    from hyper_parallel.errors import InputFileError
    from hyper_parallel.models import check_weights

    folder = write_tiny_model("mistral", tmp_path / "mistral")
    check_weights(create_model_spec(path=str(folder), overrides={"sliding_window": 8}))
    with pytest.raises(InputFileError) as caught:
        check_weights(create_model_spec(path=str(folder), overrides={"intermediate_size": 48}))
    shown = [(issue.location, issue.message) for issue in caught.value.issues]
    assert shown[0] == (
        str(folder / "model.safetensors"),
        "tensor 'model.layers.0.mlp.down_proj.weight' has shape [32, 64]; hf mistral expects [32, 48]",
    )
    assert len(caught.value.issues) == 6  # three matrices of two layers


def test_random_init_draws_transformers_distributions_whatever_the_layout(tmp_path: Path) -> None:
    from hyper_parallel.models import materialize

    folder = write_tiny_model("gemma3_text", tmp_path / "gemma3")
    spec = create_model_spec(path=str(folder), init="random")
    assert spec.weights_path is None
    drawn = [materialize(spec.build_model_fn(spec.args), spec, device="cpu", seed=7) for _ in range(2)]
    on_cpu = spec.build_model_fn(spec.args, device="cpu")
    from hyper_parallel.models import initialize

    initialize(on_cpu, spec, seed=7)
    params = dict(drawn[0].named_parameters())
    for other in (drawn[1], on_cpu):
        assert all(torch.equal(params[name], p) for name, p in other.named_parameters())
    # Gemma's norms scale by 1 + weight: built as zeros; matrices normal with std initializer_range (0.02)
    assert float(params["causal_lm.model.norm.weight"].abs().max()) == 0.0
    q = params["causal_lm.model.layers.0.self_attn.q_proj.weight"]
    assert float(q.std()) == pytest.approx(0.02, rel=0.2)
    buffers = dict(drawn[0].named_buffers())
    reference = dict(transformers.AutoModelForCausalLM.from_pretrained(folder).named_buffers())
    assert all(torch.equal(buffers["causal_lm." + name], value) for name, value in reference.items())


def test_a_hub_id_is_found_in_the_cache_offline_and_a_missing_one_is_refused_naming_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hyper_parallel.models import load_pretrained

    cache = tmp_path / "hub"
    snapshot = hub_cache(cache, "acme/tiny-mistral", lambda folder: write_tiny_model("mistral", folder))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for path in ("acme/tiny-mistral", f"acme/tiny-mistral@{COMMIT}"):
        spec = create_model_spec(path=path)
        assert (spec.weights_path, spec.args.hub_id) == (str(snapshot), path)
        assert spec.args.fetch_weights() is None  # cached: nothing to fetch
        assert spec.args.fetch_weights(dry_run=True) is None
    model = spec.build_model_fn(spec.args)
    load_pretrained(model, spec, device="cpu")
    reference = transformers.AutoModelForCausalLM.from_pretrained(snapshot)
    ids = torch.randint(0, 512, (1, 12))
    with torch.no_grad():
        assert torch.equal(model(ids), reference(ids).logits)
    with pytest.raises(ValueError, match="offline") as caught:
        create_model_spec(path="acme/other")
    assert str(caught.value) == (
        f"acme/other is not a folder on this machine, and no Hub model of that id is in the cache "
        f"(HF_HUB_CACHE={cache}; offline)"
    )
