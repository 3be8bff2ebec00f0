"""``CausalLM``: transformers' causal LM behind the trainer's model interface (token ids -> logits).

It holds transformers' module as ``causal_lm`` and changes nothing in it. Its forward passes position
ids that restart at every packed document: transformers reads the documents from them (a new one wherever
a position does not follow the previous one) and keeps them apart in its attention mask, for ``sdpa`` and
``eager`` alike, so packed rows train as if each document ran alone. ``to_empty`` gives the module's
non-persistent buffers (RoPE frequencies, embedding scales) their values back through transformers' own
initialisation, leaving every parameter as it is: built on ``meta``, they would hold garbage.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hyper_parallel.models.hf._layout import build_causal_lm
from hyper_parallel.models.hf.args import HfArgs

__all__ = ["CausalLM", "document_positions"]


def document_positions(document_ids: torch.Tensor) -> torch.Tensor:
    """Positions (batch, seq) that restart at 0 wherever the document id changes along a row."""
    seq = document_ids.shape[-1]
    index = torch.arange(seq, device=document_ids.device).expand_as(document_ids)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values
    return index - first


class CausalLM(nn.Module):
    """transformers' ``AutoModelForCausalLM`` module of ``args`` (as ``causal_lm``): ids to logits."""

    def __init__(self, args: HfArgs, device: str | torch.device) -> None:
        super().__init__()
        self.args = args
        self.causal_lm = build_causal_lm(args.config_json, args.attn_implementation, device)

    def forward(
        self, tokens: torch.Tensor, document_ids: torch.Tensor | None = None, cache: Any = None
    ) -> torch.Tensor:
        """Logits (batch, seq, vocab) of ``tokens``; packed ``document_ids`` (batch, seq) kept apart.

        With ``cache`` (``models._inference.InferenceCache``), ``tokens`` are the new ones: transformers'
        own key/value cache, kept on ``cache``, holds what came before.
        """
        if cache is not None:
            return self._decode(tokens, cache)
        positions = None
        if document_ids is not None:
            positions = document_positions(document_ids.to(tokens.device))
        out = self.causal_lm(input_ids=tokens, position_ids=positions, use_cache=False)
        logits: torch.Tensor = out.logits
        return logits

    def _decode(self, tokens: torch.Tensor, cache: Any) -> torch.Tensor:
        past = getattr(cache, "transformers_cache", None)
        if past is None:
            from transformers import DynamicCache

            past = DynamicCache(config=self.causal_lm.config)  # type: ignore[arg-type]
            cache.transformers_cache = past
        out = self.causal_lm(input_ids=tokens, cache=past, use_cache=True)  # transformers 5's name
        cache.advance(tokens.shape[1])
        logits: torch.Tensor = out.logits
        return logits

    def tie_weights(self) -> None:
        """Tie the output head to the embeddings where the config says so (after weights were assigned to a
        model built on ``meta``), and give the buffers still on ``meta`` their values on the parameters'
        device: such a model is usable once every parameter is assigned."""
        self.causal_lm.tie_weights()  # type: ignore[operator]
        if any(b.is_meta for b in self.buffers()):
            device = next((p.device for p in self.parameters() if not p.is_meta), torch.device("cpu"))
            for module in self.modules():
                for name, buffer in module.named_buffers(recurse=False):
                    if buffer is not None and buffer.is_meta:
                        module._buffers[name] = torch.empty_like(buffer, device=device)
            self.reset_buffers()

    def to_empty(self, *, device: torch.device | str | int | None, recurse: bool = True) -> CausalLM:
        """``nn.Module.to_empty``, then the non-persistent buffers computed again (parameters untouched)."""
        super().to_empty(device=device, recurse=recurse)
        self.reset_buffers()
        return self

    @torch.no_grad()
    def reset_buffers(self) -> None:
        """Compute the buffers transformers derives from the config again (after ``to_empty``).

        transformers' ``initialize_weights`` skips every tensor marked initialised (its loading path
        marks what it loaded the same way): the parameters are marked, so only the buffers are written.
        """
        for param in self.causal_lm.parameters():
            param._is_hf_initialized = True  # type: ignore[attr-defined]
        for module in self.causal_lm.modules():
            module._is_hf_initialized = False  # type: ignore[assignment]
        self.causal_lm.initialize_weights()  # type: ignore[operator]
