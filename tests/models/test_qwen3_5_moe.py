"""Qwen 3.5 MoE: logits, gradients and the load-balancing loss equal transformers'; weights in and out."""

import io
import json
from pathlib import Path
from typing import Any

import attrs
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.qwen3_5_moe")

from hyper_parallel.models import qwen3_5_moe  # noqa: E402
from hyper_parallel.models.qwen3_5_moe import QWEN3_5_MOE_FLAVORS  # noqa: E402
from hyper_parallel.models.qwen3_5_moe._modules import GroupedExperts, grouped_matmul  # noqa: E402
from hyper_parallel.models.qwen3_5_moe._runtime import Qwen3_5MoeStateDictAdapter  # noqa: E402
from hyper_parallel.parallel.expert_parallel import load_balancing_loss  # noqa: E402
from tests.support.qwen3_5_moe_reference import TINY_MOE, hf_moe_model  # noqa: E402


def _tokens(seq: int = 24) -> Any:
    return torch.randint(0, TINY_MOE.vocab_size, (2, seq), generator=torch.Generator().manual_seed(1))


def _ours_from(reference: Any) -> Any:
    model = qwen3_5_moe.create_model_spec("debugmodel").build_model_fn(TINY_MOE, device="cpu")
    model.load_state_dict(Qwen3_5MoeStateDictAdapter(TINY_MOE).from_hf(reference.state_dict()), strict=True)
    return model


def _aux(model: Any) -> Any:
    stats = [layer.stats for layer in model.moe_layers()]
    return load_balancing_loss([s.counts for s in stats], [s.prob_sums for s in stats], stats[0].tokens)


def test_35b_a3b_flavor_is_transformers_default_config() -> None:
    from transformers.models.qwen3_5_moe import Qwen3_5MoeTextConfig

    hf = Qwen3_5MoeTextConfig()
    ours = Qwen3_5MoeStateDictAdapter(QWEN3_5_MOE_FLAVORS["35B-A3B"]).hf_config()
    for key, value in ours.items():
        if key not in ("architectures", "rope_parameters", "max_position_embeddings"):
            assert getattr(hf, key) == value, key
    assert hf.layer_types.count("full_attention") * 4 == hf.num_hidden_layers == 40


def test_logits_gradients_and_aux_loss_equal_transformers() -> None:
    reference = hf_moe_model(TINY_MOE)
    ours = _ours_from(reference)
    ids = _tokens()
    hf_out = reference(ids, labels=ids, output_router_logits=True)
    logits = ours(ids)
    assert (logits - hf_out.logits).abs().max().item() <= 1e-5
    aux = _aux(ours)
    assert abs(aux.value.item() - hf_out.aux_loss.item()) <= 1e-6
    assert aux.value.item() > 1.0  # n_experts * sum f P >= 1, equality only when perfectly balanced
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss = ce + TINY_MOE.router_aux_loss_coef * aux.local
    assert abs(loss.item() - hf_out.loss.item()) <= 1e-5
    loss.backward()
    hf_out.loss.backward()
    expected = Qwen3_5MoeStateDictAdapter(TINY_MOE).from_hf(
        {name: p.grad for name, p in reference.named_parameters()}
    )
    grads = dict(ours.named_parameters())
    assert expected.keys() == grads.keys()
    worst = max((grads[n].grad - g).abs().max().item() for n, g in expected.items())
    assert worst <= 1e-5
    router = grads["layers.0.feed_forward.router.weight"].grad
    assert router.abs().max().item() > 1e-4  # the router learns (through the weights and the aux loss)


@pytest.mark.parametrize("width", [3, 8], ids=["unaligned-loop", "grouped_mm"])
def test_grouped_matmul_equals_per_expert_loop_even_with_empty_experts(width: int) -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(4, 2 * width, width, generator=generator, requires_grad=True)
    counts = torch.tensor([2, 0, 3, 1])
    x = torch.randn(6, width, generator=generator, requires_grad=True)
    out = grouped_matmul(x, weight, counts)
    expected = torch.cat([x[:2] @ weight[0].t(), x[2:5] @ weight[2].t(), x[5:] @ weight[3].t()])
    assert torch.allclose(out, expected, atol=1e-6)
    grad = torch.randn(6, 2 * width, generator=generator)
    got = torch.autograd.grad(out, (x, weight), grad)
    want = torch.autograd.grad(expected, (x, weight), grad)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want, strict=True))
    assert GroupedExperts(4, width, 5)(x, counts).shape == (6, width)


def test_adapter_reads_per_expert_and_fused_layouts_and_writes_per_expert(tmp_path: Path) -> None:
    reference = hf_moe_model(TINY_MOE)
    adapter = Qwen3_5MoeStateDictAdapter(TINY_MOE)
    fused = reference.state_dict()  # transformers' in-memory layout: gate_up_proj, down_proj
    ours = adapter.from_hf(fused)
    assert ours["layers.1.feed_forward.experts.w13"].shape == (8, 64, 64)
    assert torch.equal(
        ours["layers.1.feed_forward.experts.w13"], fused["model.layers.1.mlp.experts.gate_up_proj"]
    )
    written = adapter.to_hf(ours)
    assert "model.layers.1.mlp.experts.7.gate_proj.weight" in written
    assert "model.layers.1.mlp.experts.gate_up_proj" not in written
    again = adapter.from_hf(written)
    assert again.keys() == ours.keys()
    assert all(torch.equal(again[k], ours[k]) for k in ours)
    del written["model.layers.1.mlp.experts.3.up_proj.weight"]
    with pytest.raises(ValueError, match="layer 1 has experts 7 of n_experts=8"):
        adapter.from_hf(written)


def test_norm_topk_prob_false_keeps_the_raw_top_k_probabilities() -> None:
    from hyper_parallel.models.qwen3_5_moe._modules import MoE

    x = torch.randn(5, TINY_MOE.dim, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    raw = MoE(attrs.evolve(TINY_MOE, norm_topk_prob=False))
    torch.manual_seed(0)
    normed = MoE(TINY_MOE)
    probs, weights, experts = raw.route(x)
    assert torch.equal(weights, probs.gather(1, experts))
    assert (weights.sum(dim=1) < 1).all()
    assert torch.allclose(normed.route(x)[1].sum(dim=1), torch.ones(5))
    with pytest.raises(ValueError, match="norm_topk_prob: false has no Hugging Face"):
        Qwen3_5MoeStateDictAdapter(attrs.evolve(TINY_MOE, norm_topk_prob=False)).hf_config()


def test_debugmodel_trains_a_step_on_cpu() -> None:
    spec = qwen3_5_moe.create_model_spec("debugmodel")
    model = spec.build_model_fn(spec.args, device="cpu")
    ids = torch.randint(0, spec.args.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    (loss + spec.args.router_aux_loss_coef * _aux(model).local).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    meta = qwen3_5_moe.create_model_spec("35B-A3B")
    big = meta.build_model_fn(meta.args, device="meta")
    assert big.layers[0].feed_forward.experts.w13.shape == (256, 1024, 2048)


def test_trainer_starts_from_save_pretrained_with_transformers_first_loss(tmp_path: Path) -> None:
    """``model.weights_path`` on a ``save_pretrained`` folder: step 1 has transformers' loss on that batch."""
    from hyper_parallel.trainer import LLMTrainer
    from tests.support.trainer import tiny_config

    args = tiny_config("qwen3_5_moe").model.args
    reference = hf_moe_model(args)
    reference.save_pretrained(tmp_path / "hf")
    jsonl = tmp_path / "metrics.jsonl"
    overrides = {
        "model.weights_path": str(tmp_path / "hf"),
        "training.max_steps": "1",
        "metrics.log_freq": "1",
        "metrics.enable_jsonl": "true",
        "metrics.jsonl_path": str(jsonl),
    }
    console = io.StringIO()
    trainer = LLMTrainer(tiny_config("qwen3_5_moe", overrides), stream=console)
    try:
        batches = iter(trainer.config.dataloader.build(trainer.data_request))  # the same first batches
        expected = []
        for _ in range(trainer.accumulation_steps):
            batch = next(batches)
            # transformers shifts the labels and adds router_aux_loss_coef x its aux loss, as we do
            out = reference(batch["input_ids"], labels=batch["labels"], output_router_logits=True)
            expected.append(float(out.loss))
        (result,) = trainer.train()
    finally:
        trainer.close()
    assert abs(result.loss - sum(expected) / len(expected)) <= 1e-4
    # logged beside the loss: the aux loss (mean over micro-batches) and tokens per expert over the step
    (record,) = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert record["aux_loss"] == pytest.approx(result.extra["aux_loss"])
    assert record["aux_loss"] > 1.0
    tokens = trainer.accumulation_steps * 2 * 32 * args.n_experts_per_token  # micro batch 2, seq 32
    assert record["expert_load_mean"] == tokens / args.n_experts
    assert tokens / args.n_experts < record["expert_load_max"] <= tokens / args.n_experts_per_token
    line = next(text for text in console.getvalue().splitlines() if "step 1/1" in text)
    assert f"aux_loss {record['aux_loss']:.4g}" in line
    assert f"expert_load_max {record['expert_load_max']:.4g}" in line


def test_a_config_json_of_another_flavor_names_the_moe_flavor_that_fits(tmp_path: Path) -> None:
    from hyper_parallel.errors import InputFileError
    from hyper_parallel.models._weights_check import _check_config_json

    spec = qwen3_5_moe.create_model_spec("debugmodel")
    file = tmp_path / "config.json"
    file.write_text(json.dumps(Qwen3_5MoeStateDictAdapter(QWEN3_5_MOE_FLAVORS["35B-A3B"]).hf_config()))
    with pytest.raises(InputFileError) as info:
        _check_config_json(spec, spec.state_dict_adapter(spec.args), file)
    messages = [issue.message for issue in info.value.issues]
    assert messages[0] == "model.flavor '35B-A3B' fits this config.json; it differs in:"
    assert (
        "num_experts is 256 here, qwen3_5_moe debugmodel has 8; model.overrides.n_experts: 256 fits"
        in messages
    )


def test_a_bf16_autocast_training_step_runs() -> None:
    """Under bf16 autocast (the trainer's bf16 run without FSDP) the shared expert's output is bf16 and the
    routed outputs fp32; they are added in one dtype (``python -m bench gpu --check --tiny`` found it)."""
    from hyper_parallel.components.loss._runtime import CausalLMLossFn
    from hyper_parallel.models import qwen3_5_moe

    spec = qwen3_5_moe.create_model_spec("debugmodel")
    torch.manual_seed(0)
    model = spec.build_model_fn(spec.args, device="cpu")
    tokens = torch.randint(0, spec.args.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens)
    assert logits.dtype == torch.bfloat16
    loss = CausalLMLossFn()(logits, tokens)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_grouped_mm_is_public_and_multiplies_each_group_by_its_weight() -> None:
    """Written against torch 2.13.0: ``grouped_matmul`` calls ``torch.nn.functional.grouped_mm`` where torch
    has it, and falls back to one matmul per expert where it does not, which would hide its absence."""
    import torch.nn.functional as F

    assert hasattr(F, "grouped_mm"), f"torch {torch.__version__} (written against 2.13.0)"
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(10, 16, generator=generator), torch.randn(3, 8, 16, generator=generator)
    counts = [4, 0, 6]
    out = F.grouped_mm(x, weight.transpose(-2, -1), offs=torch.tensor(counts).cumsum(0).to(torch.int32))
    expected = torch.cat([part @ weight[e].t() for e, part in enumerate(x.split(counts)) if counts[e]])
    assert torch.allclose(out, expected, atol=1e-5)
