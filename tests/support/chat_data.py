"""Chat data the chat tests share: a Qwen-style tokenizer folder, its conversations, prepared documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Qwen's ChatML layout, with the generation marks transformers reads for the assistant mask.
QWEN_STYLE = (
    "{%- for message in messages %}\n"
    "{%- if message.role == 'assistant' %}\n"
    "{{- '<|im_start|>assistant\\n' }}"
    "{% generation %}{{- message.content + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}\n"
    "{%- else %}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATS = [
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "content": "Four."},
    ],
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue, like the sky."},
        {"role": "user", "content": "Another?"},
        {"role": "assistant", "content": "Green"},
    ],
]


def qwen_style_tokenizer(folder: Path, template: str = QWEN_STYLE) -> Path:
    """A tiny byte-level BPE tokenizer with ChatML specials and ``template``, saved like a Hub folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([m["content"] for chat in CHATS for m in chat] * 5, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": template}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def write_chats(path: Path, chats: list[Any]) -> Path:
    """``chats`` as ``{"messages": ...}`` JSON lines at ``path``."""
    path.write_text("".join(json.dumps({"messages": chat}) + "\n" for chat in chats))
    return path


def documents(folder: Path) -> list[tuple[list[int], list[int]]]:
    """Each prepared document's ids and mask."""
    from hyper_parallel.components.dataloader._corpus import Corpus
    from hyper_parallel.data import shards

    corpus = Corpus(shards.open_prepared(folder).shards)
    out = []
    for d in range(corpus.documents):
        ids, mask = corpus.document(d)
        assert mask is not None
        out.append((ids.tolist(), mask.tolist()))
    return out
