"""``tokenizer.chat_template``: presets, the built-in format as Jinja, files, and the round trip through the
export (``apply_chat_template`` on the exported folder gives the ids ``prepare`` wrote)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

pytest.importorskip("jinja2")
tokenizers = pytest.importorskip("tokenizers")

from hyper_parallel.components.dataloader._prepared_check import (  # noqa: E402
    PreparedDataError,
    open_for_training,
)
from hyper_parallel.components.tokenizer import ByteTokenizer, HuggingFaceTokenizer  # noqa: E402
from hyper_parallel.components.tokenizer._export import tokenizer_files  # noqa: E402
from hyper_parallel.components.tokenizer.chat_templates import PRESETS, builtin_template  # noqa: E402
from hyper_parallel.config import ConfigError, load_config  # noqa: E402
from hyper_parallel.data import shards  # noqa: E402
from hyper_parallel.data.chat import ChatRenderer, builtin_chat  # noqa: E402
from hyper_parallel.errors import InputFileError  # noqa: E402
from tests.support.chat_data import documents, qwen_style_tokenizer, write_chats  # noqa: E402
from tests.support.prepared import prepare, run_prepare, tokenizer_config  # noqa: E402

ZED = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "My name is Zed. <s héllo\n"},
    {"role": "assistant", "content": "Hi Zed!"},
    {"role": "user", "content": "What is my name?"},
    {"role": "assistant", "content": "Zed"},
]


def _config(folder: Path, tokenizer: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(
        "model:\n  _target_: hyper_parallel.models.llama3.create_model_spec\n  flavor: debugmodel\n"
        f"tokenizer:\n{tokenizer}",
        encoding="utf-8",
    )
    return path


@pytest.mark.parametrize("add_bos", [True, False])
def test_the_builtin_preset_gives_exactly_the_builtin_formats_ids_and_mask(add_bos: bool) -> None:
    templated = ByteTokenizer.Config(add_bos=add_bos, chat_template="builtin").build()
    plain = ByteTokenizer.Config(add_bos=add_bos).build()
    assert templated.chat_template == builtin_template(add_bos=add_bos)
    assert ChatRenderer(templated).encode_batch([ZED]) == [builtin_chat(plain, ZED)]


@pytest.mark.parametrize(
    ("preset", "trained"),
    [("chatml", "Hi Zed!<|im_end|>Zed<|im_end|>"), ("llama3", "Hi Zed!<|eot_id|>Zed<|eot_id|>")],
)
def test_each_preset_trains_on_the_answers_and_the_token_ending_them(preset: str, trained: str) -> None:
    tok = ByteTokenizer.Config(chat_template=preset).build()
    ((ids, mask),) = ChatRenderer(tok).encode_batch([ZED])
    assert tok.decode([i for i, m in zip(ids, mask, strict=True) if m]) == trained
    text, _ = ChatRenderer(tok).render(ZED)
    assert text.startswith("<|im_start|>system\nAnswer briefly.<|im_end|>\n" if preset == "chatml" else "<s>")


def test_an_unknown_preset_is_refused_at_resolve_with_the_closest_name(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        "  _target_: hyper_parallel.components.tokenizer.ByteTokenizer.Config\n  chat_template: chatlm\n",
    )
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert str(info.value).endswith(
        "tokenizer.chat_template: 'chatlm' is no preset (builtin, chatml, llama3) and no path to a Jinja "
        "file (a value with a '/' or a .jinja suffix); did you mean 'chatml'?"
    )
    assert f"{config}:6:" in str(info.value)


def test_a_missing_template_file_is_an_input_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "template.jinja"
    with pytest.raises(InputFileError) as info:
        ByteTokenizer.Config(chat_template=str(missing)).build()
    assert str(info.value) == f"{missing}: tokenizer.chat_template: no such chat template file"


def test_a_template_file_is_read_as_the_tokenizers_template(tmp_path: Path) -> None:
    file = tmp_path / "t.jinja"
    file.write_text(PRESETS["chatml"] or "", encoding="utf-8")
    assert ByteTokenizer.Config(chat_template=str(file)).build().chat_template == PRESETS["chatml"]


def test_prepare_takes_a_preset_name_and_training_refuses_another_template(tmp_path: Path) -> None:
    data = write_chats(tmp_path / "chat.jsonl", [ZED])
    bytes_config = tokenizer_config(tmp_path / "cfg")
    out = prepare([data], tmp_path / "prep", bytes_config, "--format", "chat", "--chat-template", "chatml")
    manifest = shards.open_prepared(out).manifest
    assert manifest["chat_template_sha256"] == hashlib.sha256((PRESETS["chatml"] or "").encode()).hexdigest()
    chatml = ByteTokenizer.Config(chat_template="chatml").build()
    assert documents(out) == ChatRenderer(chatml).encode_batch([ZED])
    fingerprint = shards.tokenizer_fingerprint(chatml)
    assert open_for_training(str(out), fingerprint, chatml.chat_template).documents == 1
    with pytest.raises(PreparedDataError) as info:
        open_for_training(str(out), fingerprint, None)  # the config's tokenizer: the built-in format
    assert str(info.value) == (
        f"{out / 'manifest.json'}: dataset.paths: its conversations were rendered with the chat template of "
        f"SHA-256 {manifest['chat_template_sha256'][:16]}, but the config's tokenizer renders them with the "
        "built-in format: set tokenizer.chat_template to the template given to prepare --chat-template (or "
        "prepare the data again with this config)"
    )


def test_prepare_refuses_an_unknown_preset_name_with_the_closest(tmp_path: Path) -> None:
    data = write_chats(tmp_path / "chat.jsonl", [ZED])
    status, _, err = run_prepare(
        "prepare", data, "--output", tmp_path / "o", "--config-file", tokenizer_config(tmp_path / "c"),
        "--format", "chat", "--chat-template", "llama",
    )  # fmt: skip
    assert (status, err) == (
        2,
        "--chat-template: 'llama' is no preset (builtin, chatml, llama3) and no file; "
        "did you mean 'llama3'?\n",
    )


def _export_tokenizer(cfg: ByteTokenizer.Config | HuggingFaceTokenizer.Config, folder: Path) -> Path:
    folder.mkdir()
    for name, content in tokenizer_files(cfg, None).items():
        (folder / name).write_bytes(content)
    return folder


@pytest.mark.parametrize("add_bos", [True, False])
def test_the_byte_tokenizers_export_applies_the_builtin_format_as_prepare_did(
    tmp_path: Path, add_bos: bool
) -> None:
    transformers = pytest.importorskip("transformers")
    data = write_chats(tmp_path / "chat.jsonl", [ZED])
    config = _config(
        tmp_path / "cfg",
        f"  _target_: hyper_parallel.components.tokenizer.ByteTokenizer.Config\n  add_bos: {add_bos}\n",
    )
    out = prepare([data], tmp_path / "prep", config, "--format", "chat")
    export = _export_tokenizer(load_config(config).tokenizer, tmp_path / "export")
    auto = transformers.AutoTokenizer.from_pretrained(export)
    encoded = auto.apply_chat_template(
        ZED, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert documents(out) == [(list(encoded["input_ids"]), list(encoded["assistant_masks"]))]
    prompt = auto.apply_chat_template(ZED[:2], tokenize=True, add_generation_prompt=True, return_dict=True)
    plain = ByteTokenizer.Config(add_bos=add_bos).build()
    header = list(b"<|assistant|>\n")
    assert list(prompt["input_ids"]) == builtin_chat(plain, ZED[:2])[0] + header


def test_a_hugging_face_tokenizers_export_applies_the_preset_training_used(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    folder = qwen_style_tokenizer(tmp_path / "tok", template="{{ 'its own, unused' }}")
    data = write_chats(tmp_path / "chat.jsonl", [ZED])
    tokenizer = (
        "  _target_: hyper_parallel.components.tokenizer.HuggingFaceTokenizer.Config\n"
        f"  path: {folder}\n  chat_template: chatml\n"
    )
    config = _config(tmp_path / "cfg", tokenizer)
    out = prepare([data], tmp_path / "prep", config, "--format", "chat")
    export = _export_tokenizer(load_config(config).tokenizer, tmp_path / "export")
    assert json.loads((export / "tokenizer_config.json").read_text())["chat_template"] == PRESETS["chatml"]
    auto = transformers.AutoTokenizer.from_pretrained(export)
    encoded = auto.apply_chat_template(
        ZED, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    prepared = documents(out)
    assert prepared == [(list(encoded["input_ids"]), list(encoded["assistant_masks"]))]
    assert sum(prepared[0][1]) > 0


def _dry_run(*argv: str) -> tuple[int, str]:
    import io

    from hyper_parallel.launch import main

    out, err = io.StringIO(), io.StringIO()
    status = main(["--dry-run", *argv], out=out, err=err)
    return status, err.getvalue()


def test_dry_run_refuses_an_unknown_preset_and_a_missing_file_in_one_line_each(tmp_path: Path) -> None:
    from tests.support.trainer import debug_config_path

    debug = str(debug_config_path("llama3"))
    assert _dry_run("--config-file", debug, "--tokenizer.chat_template", "llama") == (
        2,
        "--tokenizer.chat_template: 'llama' is no preset (builtin, chatml, llama3) and no path to a Jinja "
        "file (a value with a '/' or a .jinja suffix); did you mean 'llama3'?\n"
        "1 problem found; nothing was started.\n",
    )
    missing = tmp_path / "t.jinja"
    status, err = _dry_run("--config-file", debug, "--tokenizer.chat_template", str(missing))
    assert (status, err.splitlines()[0]) == (
        2,
        f"{missing}: tokenizer.chat_template: no such chat template file",
    )


def test_a_template_path_that_is_no_small_regular_file_is_refused_naming_it(tmp_path: Path) -> None:
    import os

    from hyper_parallel.components.tokenizer.chat_templates import MAX_TEMPLATE_BYTES

    big = tmp_path / "big.jinja"
    big.write_bytes(b"x" * (MAX_TEMPLATE_BYTES + 1))
    fifo = tmp_path / "fifo.jinja"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    for path, why in (
        (big, f"larger than {MAX_TEMPLATE_BYTES:,} bytes"),
        (fifo, "is a FIFO, not a regular file: give a file (it would be waited on or read forever)"),
    ):
        with pytest.raises(InputFileError) as info:
            ByteTokenizer.Config(chat_template=str(path)).build()
        assert (
            str(info.value)
            == f"{path}: tokenizer.chat_template: cannot be read as a UTF-8 chat template: {why}"
        )
