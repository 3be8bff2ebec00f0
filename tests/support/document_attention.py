"""The packed-documents model fixture the attention tests share: two rows of documents (one of them a
one-token document, boundaries inside and across 64-token groups), a model built with fixed weights and an
:class:`AttentionPlan`, and its loss and gradients against the dense-masked reference path."""

from __future__ import annotations

from typing import Any

import attrs
import torch
import torch.nn.functional as F

from hyper_parallel.models._layers import AttentionPlan
from hyper_parallel.models.llama3 import LLAMA3_FLAVORS
from hyper_parallel.models.llama3 import _modules as llama_modules
from hyper_parallel.models.qwen3_5 import QWEN3_5_FLAVORS
from hyper_parallel.models.qwen3_5 import _modules as qwen_modules

__all__ = [
    "CPU",
    "DENSE",
    "LENGTHS",
    "SEQ",
    "assert_equals_the_dense_masked_path",
    "build",
    "document_ids",
    "loss_and_grads",
]

SEQ = 320  # above DENSE_MASK_MAX_SEQ: the variable-length path on the CPU
#: Row 0: a one-token document, boundaries inside and across 64-token groups; row 1: one document.
LENGTHS = ((5, 70, 1, 244), (SEQ,))
#: The plan of a run on the CPU.
CPU = AttentionPlan.for_device("cpu")
#: The replaced path: the dense document mask at every row length.
DENSE = AttentionPlan(dense_mask_max_seq=SEQ)


def document_ids() -> Any:
    rows = [torch.cat([torch.full((n,), i % 2) for i, n in enumerate(row)]) for row in LENGTHS]
    return torch.stack(rows)


def build(name: str, plan: AttentionPlan | None = None) -> Any:
    """Model ``name`` (same weights every call) attending as ``plan`` says (None: the CPU's plan)."""
    torch.manual_seed(0)
    model: Any
    if name == "llama3":
        model = llama_modules.build_llama3(attrs.evolve(LLAMA3_FLAVORS["debugmodel"], vocab_size=512), "cpu")
    else:
        model = qwen_modules.build_qwen3_5(attrs.evolve(QWEN3_5_FLAVORS["debugmodel"], vocab_size=512), "cpu")
    model.attention_plan = plan
    return model


def loss_and_grads(model: Any) -> tuple[float, dict[str, Any]]:
    tokens = torch.randint(0, 512, (2, SEQ + 1), generator=torch.Generator().manual_seed(1))
    logits = model(tokens[:, :-1], document_ids=document_ids())
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    model.zero_grad()
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_equals_the_dense_masked_path(name: str, new_loss: float, new_grads: dict[str, Any]) -> None:
    """The loss and gradients of model ``name`` on the dense-masked path equal these."""
    old_loss, old_grads = loss_and_grads(build(name, DENSE))
    assert abs(new_loss - old_loss) <= 1e-5
    assert new_grads.keys() == old_grads.keys()
    for key, grad in new_grads.items():
        assert (grad - old_grads[key]).abs().max().item() <= 1e-5 * max(
            1.0, old_grads[key].abs().max().item()
        )
