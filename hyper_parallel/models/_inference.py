"""Decoding with the built-in models: the inference cache their forward accepts, sampling, the token loop.

Recomputing the whole sequence for every new token costs O(n^2) forwards of the prefix; the cache keeps what
each block would recompute: the keys and values of an attention block (``LayerCache.attend``), and the last
inputs of the short convolution plus the recurrent state of a Gated DeltaNet block (``conv``, ``state``).
``model(tokens, cache=cache)`` runs only the new tokens, at positions ``cache.position`` on, and advances the
cache; the first call (the prompt, "prefill") runs the same kernels as training. Without ``cache`` the models'
forward is the training forward, unchanged.

:func:`generate_ids` is the loop ``python -m hyper_parallel.generate`` runs: greedy at temperature 0,
otherwise sampled from the temperature-scaled distribution cut to its top-``p`` mass, drawn from a seeded
generator so a seed reproduces the text. ``use_cache=False`` recomputes the whole sequence at every step
(the reference the cache is tested against).

Private and torch-importing: imported by the model modules and by the generate command only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["InferenceCache", "LayerCache", "causal_mask", "generate_ids", "next_token"]


def causal_mask(queries: int, keys: int, device: torch.device) -> tuple[torch.Tensor | None, bool]:
    """``(attn_mask, is_causal)`` for ``queries`` new tokens that follow ``keys - queries`` cached ones.

    The new tokens are the last ones: each sees every cached key and the new keys up to itself. A prompt
    (nothing cached) is plain causal attention, a single token sees everything: no mask for either.
    """
    if queries == keys:
        return None, True
    if queries == 1:
        return None, False
    mask = torch.ones(queries, keys, dtype=torch.bool, device=device).tril(keys - queries)
    return mask, False


class LayerCache:
    """What one block keeps between decoding calls.

    An attention block appends its keys and values (batch, kv_heads, seq, head_dim) through
    :meth:`attend`, into buffers of ``capacity`` positions allocated on first use (grown when exceeded).
    A Gated DeltaNet block keeps ``conv`` (batch, channels, kernel - 1), the inputs its causal
    convolution still reaches, and ``state`` (batch, heads, d_k, d_v), the recurrent state after the
    last token; both None before the first call.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.length = 0
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self.conv: torch.Tensor | None = None
        self.state: torch.Tensor | None = None

    def attend(
        self, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, bool]:
        """Append the new ``keys``/``values``; every key and value so far, and the new queries' mask.

        Returns ``(keys, values, attn_mask, is_causal)`` for ``scaled_dot_product_attention``.
        """
        new = keys.shape[2]
        end = self.length + new
        if self._keys is None or self._values is None:
            size = max(self.capacity, end)
            self._keys = keys.new_empty((*keys.shape[:2], size, keys.shape[3]))
            self._values = values.new_empty((*values.shape[:2], size, values.shape[3]))
        elif end > self._keys.shape[2]:
            more = end - self._keys.shape[2]
            self._keys = torch.cat(
                (self._keys, self._keys.new_empty((*keys.shape[:2], more, keys.shape[3]))), 2
            )
            self._values = torch.cat(
                (self._values, self._values.new_empty((*values.shape[:2], more, values.shape[3]))), 2
            )
        self._keys[:, :, self.length : end] = keys
        self._values[:, :, self.length : end] = values
        self.length = end
        mask, is_causal = causal_mask(new, end, keys.device)
        return self._keys[:, :, :end], self._values[:, :, :end], mask, is_causal


class InferenceCache:
    """The cache of a whole model: ``position`` tokens seen so far, one :class:`LayerCache` per block.

    ``capacity`` is the longest sequence expected (prompt plus new tokens): attention buffers are
    allocated at that size once instead of growing at every token.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.position = 0
        self._layers: dict[str, LayerCache] = {}

    def layer(self, name: str) -> LayerCache:
        """The cache of block ``name`` (created empty on first use)."""
        found = self._layers.get(name)
        if found is None:
            found = self._layers[name] = LayerCache(self.capacity)
        return found

    def advance(self, tokens: int) -> None:
        """Count ``tokens`` more positions as seen (the model calls it after its blocks ran)."""
        self.position += tokens


def next_token(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    """The next token from ``logits`` (vocab,): the argmax at ``temperature`` 0, else a seeded draw.

    The draw is from ``softmax(logits / temperature)`` restricted to the smallest set of most likely
    tokens whose probabilities reach ``top_p`` (1 keeps them all), renormalised; computed on the CPU in
    fp32 so a seed gives the same token on any device.
    """
    if temperature == 0:
        return int(torch.argmax(logits).item())
    probs = F.softmax(logits.detach().float().cpu() / temperature, dim=-1)
    if top_p < 1:
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(0) - sorted_probs  # mass of the more likely tokens
        sorted_probs[before >= top_p] = 0  # the most likely token always stays
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator).item())


@torch.no_grad()
def generate_ids(
    model: nn.Module,
    prompt: list[int],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    stop_ids: Collection[int] = (),
    vocab_size: int | None = None,
    use_cache: bool = True,
    inputs: Mapping[str, torch.Tensor] | None = None,
) -> list[int]:
    """The ids ``model`` continues ``prompt`` with: at most ``max_new_tokens``, ending at a stop id.

    A stop id (the end-of-sequence token) ends the continuation and is included as its last id. With
    ``vocab_size`` (the tokenizer's, often below the model's padded embedding rows) only ids below it are
    ever picked.
    ``use_cache`` runs the prompt once and then one token per step through an :class:`InferenceCache`;
    without it, every step recomputes the whole sequence. ``inputs`` are passed to every call of the model
    beside the ids (a vision-language model's ``pixel_values`` and ``grid_thw``; it decodes without a cache).
    """
    if not prompt:
        raise ValueError("the prompt holds no tokens")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    cache = InferenceCache(len(prompt) + max_new_tokens) if use_cache else None
    new: list[int] = []
    step = ids
    while len(new) < max_new_tokens:
        logits = model(step, cache=cache) if cache is not None else model(ids, **(inputs or {}))
        last = logits[0, -1] if vocab_size is None else logits[0, -1, :vocab_size]
        token = next_token(last, temperature, top_p, generator)
        new.append(token)
        if token in stop_ids:
            break
        step = torch.tensor([[token]], dtype=torch.long, device=device)
        if cache is None:
            ids = torch.cat((ids, step), dim=1)
    return new
