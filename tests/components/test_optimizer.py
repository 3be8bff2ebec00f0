"""Optimizer.Config.build(model): real torch optimizers and weight-decay parameter groups (CPU)."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from hyper_parallel.components.optimizer import SGD, AdamW, Optimizer  # noqa: E402


class RMSNorm(nn.Module):
    """A model's own norm class: recognised by name, like the built-in models' RMSNorm."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: "torch.Tensor") -> "torch.Tensor":
        return x * self.weight


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 11, dim: int = 4, tied: bool = False) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)
        self.final_norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, ids: "torch.Tensor") -> "torch.Tensor":
        return self.output(self.final_norm(self.proj(self.norm(self.tok_embeddings(ids)))))


def groups(opt: "torch.optim.Optimizer") -> dict[str, tuple[set[str], float]]:
    return {g["name"]: (set(g["param_names"]), g["weight_decay"]) for g in opt.param_groups}


def test_default_groups_exempt_biases_and_norms_not_embeddings() -> None:
    opt = AdamW.Config(weight_decay=0.1).build(TinyLM())
    assert isinstance(opt, torch.optim.AdamW)
    assert groups(opt) == {
        "decay": ({"tok_embeddings.weight", "proj.weight", "output.weight"}, 0.1),
        "no_decay": ({"norm.weight", "norm.bias", "proj.bias", "final_norm.weight"}, 0.0),
    }


def test_flags_switch_each_exemption() -> None:
    cfg = AdamW.Config(
        weight_decay=0.2,
        no_decay_bias=False,
        no_decay_norm=False,
        no_decay_embedding=True,
        no_decay_names=("output",),
    )
    assert groups(cfg.build(TinyLM())) == {
        "decay": ({"norm.weight", "norm.bias", "proj.weight", "proj.bias", "final_norm.weight"}, 0.2),
        "no_decay": ({"tok_embeddings.weight", "output.weight"}, 0.0),
    }


def test_everything_decays_when_all_exemptions_are_off() -> None:
    cfg = SGD.Config(weight_decay=0.01, no_decay_bias=False, no_decay_norm=False)
    opt = cfg.build(TinyLM())
    assert [g["name"] for g in opt.param_groups] == ["decay"]
    assert len(opt.param_groups[0]["params"]) == 7


def test_tied_and_frozen_parameters() -> None:
    model = TinyLM(tied=True)
    model.proj.weight.requires_grad_(False)
    opt = AdamW.Config(no_decay_embedding=True).build(model)
    all_params = [p for g in opt.param_groups for p in g["params"]]
    assert len(all_params) == len({id(p) for p in all_params}) == 5
    # The tied weight is owned by the embedding (its first owner), so the embedding flag exempts it;
    # the frozen projection weight is left out, so nothing is left to decay.
    assert groups(opt) == {
        "no_decay": (
            {"tok_embeddings.weight", "norm.weight", "norm.bias", "proj.bias", "final_norm.weight"},
            0.0,
        )
    }
    assert opt.param_groups[0]["params"][0] is model.output.weight


def test_adamw_honours_every_field() -> None:
    cfg = AdamW.Config(lr=0.02, betas=(0.8, 0.9), eps=1e-6, amsgrad=True, implementation="for_loop")
    opt = cfg.build(TinyLM())
    d = opt.defaults
    assert (d["lr"], d["betas"], d["eps"], d["amsgrad"], d["foreach"]) == (
        0.02,
        (0.8, 0.9),
        1e-6,
        True,
        False,
    )
    assert AdamW.Config(implementation="foreach").build(TinyLM()).defaults["foreach"] is True
    assert AdamW.Config(implementation="fused").build(TinyLM()).defaults["fused"] is True
    auto = AdamW.Config().build(TinyLM()).defaults
    assert auto["foreach"] is None
    assert not auto["fused"]


def test_sgd_honours_every_field() -> None:
    cfg = SGD.Config(lr=0.5, momentum=0.9, dampening=0.0, nesterov=True, weight_decay=0.01)
    opt = cfg.build(TinyLM())
    assert isinstance(opt, torch.optim.SGD)
    d = opt.defaults
    assert (d["lr"], d["momentum"], d["dampening"], d["nesterov"]) == (0.5, 0.9, 0.0, True)
    assert groups(opt)["decay"][1] == 0.01


def test_adamw_step_decays_only_the_decay_group() -> None:
    """With zero gradients AdamW's update is pure decoupled decay: p <- p * (1 - lr * wd)."""
    torch.manual_seed(0)
    model = TinyLM()
    opt = AdamW.Config(lr=0.1, weight_decay=0.5).build(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = dict(model.named_parameters())
    for name in ("tok_embeddings.weight", "proj.weight", "output.weight"):
        torch.testing.assert_close(after[name].detach(), before[name] * (1 - 0.1 * 0.5))
    for name in ("norm.weight", "norm.bias", "proj.bias", "final_norm.weight"):
        assert torch.equal(after[name].detach(), before[name]), name


def test_optimizer_trains_the_model() -> None:
    torch.manual_seed(0)
    model = TinyLM()
    opt = AdamW.Config(lr=0.05).build(model)
    ids = torch.tensor([[1, 2, 3, 4]])
    losses = []
    for _ in range(20):
        loss = nn.functional.cross_entropy(model(ids)[0], ids[0])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.5


def test_no_trainable_parameters_is_an_error() -> None:
    model = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        AdamW.Config().build(model)


def test_base_config_names_the_class() -> None:
    with pytest.raises(NotImplementedError, match=r"Optimizer\.Config"):
        Optimizer.Config().build(TinyLM())
