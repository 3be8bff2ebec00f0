"""Shared by the component tests: a tiny tokenizer, corpus and language models (with and without dropout).

Needs torch and tokenizers; only imported by modules that skip without them.
"""

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

WORDS = [
    *("the", "quick", "brown", "fox", "jumps", "over", "a"),
    *("lazy", "dog", "while", "seven", "small", "cats", "sleep"),
]
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def train_tokenizer(folder: Path, *, with_config: bool = True) -> Path:
    """Train a word-level tokenizer on WORDS, save ``tokenizer.json`` (+ config) in ``folder``."""
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=SPECIALS))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    if with_config:
        config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "pad_token": "<pad>"}
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def document(i: int) -> str:
    """Document ``i`` of the test corpus: 1 to 7 words, different for each i."""
    return " ".join(WORDS[(i * 3 + k) % len(WORDS)] for k in range(1 + i % 7))


def write_jsonl(path: Path, count: int, start: int = 0) -> Path:
    with path.open("w", encoding="utf-8") as handle:
        for i in range(start, start + count):
            handle.write(json.dumps({"text": document(i), "id": i}) + "\n")
    return path


class TinyLM(torch.nn.Module):
    """Embedding, norm, linear head: logits ``[batch, seq, vocab]``."""

    def __init__(self, vocab: int, dim: int = 8) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.mix = torch.nn.Linear(dim, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor, document_ids: torch.Tensor | None = None) -> torch.Tensor:
        # document_ids (packed documents) is accepted like the built-in models do, and ignored: a toy.
        h = self.embed(ids)
        # A causal running mean so position t sees tokens <= t.
        h = h.cumsum(1) / torch.arange(1, ids.size(1) + 1, device=ids.device)[None, :, None]
        return self.head(torch.tanh(self.mix(self.norm(h))))


class DropoutLM(TinyLM):
    """TinyLM with dropout on the embeddings, so every step draws from torch's generator."""

    def __init__(self, vocab: int) -> None:
        super().__init__(vocab)
        self.drop = torch.nn.Dropout(0.3)

    def forward(self, ids: Any) -> Any:
        h = self.drop(self.embed(ids))
        h = h.cumsum(1) / torch.arange(1, ids.size(1) + 1)[None, :, None]
        return self.head(torch.tanh(self.mix(self.norm(h))))


def batches_equal(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b, strict=True)
    )
