"""A file the config names that is wrong exits 2 with ``FILE: problem`` lines and no traceback.

Each case launches the command line in this process (``launch.main``) on a tiny Llama 3 with a file made
wrong in one way, and asserts the whole message and the exit status. What can be checked before anything
is built (first records, tokenizer, weights folder) is refused there, so most cases cost milliseconds.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")
pytest.importorskip("safetensors.torch")

from hyper_parallel.launch import main  # noqa: E402
from tests.support.components import train_tokenizer  # noqa: E402
from tests.support.processes import torchrun  # noqa: E402
from tests.support.trainer import as_flags, debug_config_path, tiny_overrides, write_hf_weights  # noqa: E402

HF_TOKENIZER = "hyper_parallel.components.tokenizer.HuggingFaceTokenizer.Config"


def launch(overrides: dict[str, str], *, dry_run: bool = False) -> tuple[int, str]:
    """Exit status and stderr of ``train_lm`` on the tiny Llama 3 with ``overrides``."""
    out, err = io.StringIO(), io.StringIO()
    flags = as_flags(tiny_overrides("llama3", **{"metrics.log_freq": "4", **overrides}))
    argv = ["--config-file", str(debug_config_path("llama3")), *flags, *(["--dry-run"] if dry_run else [])]
    status = main(argv, out=out, err=err)
    assert "Traceback" not in err.getvalue()
    return status, err.getvalue()


def jsonl(path: Path) -> dict[str, str]:
    return {"dataloader.dataset.source": "jsonl", "dataloader.dataset.paths": f"[{path}]"}


# -- data --------------------------------------------------------------------------------------------------
def _record_without_the_text_field(tmp: Path) -> tuple[dict[str, str], str]:
    data = tmp / "data.jsonl"
    data.write_text('\n{"body": "a dog", "id": 1}\n')
    message = (
        f"{data}:2: no string field 'text' (the record's keys: 'body', 'id'); set "
        "dataloader.dataset.text_field to the key holding the text"
    )
    return jsonl(data), message


def _empty_data(tmp: Path) -> tuple[dict[str, str], str]:
    data = tmp / "data.jsonl"
    data.write_text("\n\n")
    return jsonl(data), f"{data}: empty: no JSON record to train on"


def _bad_utf8(tmp: Path) -> tuple[dict[str, str], str]:
    data = tmp / "data.jsonl"
    data.write_bytes(b'{"text": "caf\xe9"}\n')
    return jsonl(data), f"{data}:1: not UTF-8 text: byte 0xe9 at column 14"


def _folder_without_jsonl(tmp: Path) -> tuple[dict[str, str], str]:
    (tmp / "corpus").mkdir()
    (tmp / "corpus" / "notes.txt").write_text("not jsonl")
    return jsonl(
        tmp / "corpus"
    ), f"{tmp / 'corpus'}: no .jsonl file under it (hidden files and folders are skipped)"


def _record_not_an_object(tmp: Path) -> tuple[dict[str, str], str]:
    data = tmp / "data.jsonl"
    data.write_text('{"text": "the first record is fine"}\n["the second is a list"]\n')
    return jsonl(data), f"{data}:2: not a JSON object"


def _missing_data_path(tmp: Path) -> tuple[dict[str, str], str]:
    # refused at resolve time already (as --dry-run would), at the flag that gave the path
    message = (
        f"--dataloader.dataset.paths: dataloader.dataset.paths[0]: '{tmp / 'nowhere.jsonl'}' does not "
        "exist on this machine\n1 problem found; nothing was started."
    )
    return jsonl(tmp / "nowhere.jsonl"), message


# -- tokenizer ---------------------------------------------------------------------------------------------
def _tokenizer(folder: Path, **extra: str) -> dict[str, str]:
    data = folder.parent / "data.jsonl"
    data.write_text("".join(json.dumps({"text": "the quick brown fox " * 8}) + "\n" for _ in range(40)))
    return {
        **jsonl(data),
        "tokenizer._target_": HF_TOKENIZER,
        "tokenizer.path": str(folder),
        "model.overrides.vocab_size": "64",
        **extra,
    }


def _tokenizer_without_eos_while_packing(tmp: Path) -> tuple[dict[str, str], str]:
    folder = train_tokenizer(tmp / "tok", with_config=False)
    message = (
        f"{folder / 'tokenizer.json'}: has no eos token, which dataloader.dataset.pack_sequences needs to "
        "separate documents; set tokenizer.eos_token to one of its tokens, or pack_sequences to false"
    )
    return _tokenizer(folder), message


def _eos_token_not_in_the_vocabulary(tmp: Path) -> tuple[dict[str, str], str]:
    folder = train_tokenizer(tmp / "tok")
    message = (
        f"{folder / 'tokenizer.json'}: eos_token '<eot>' is not in the tokenizer's vocabulary (named by "
        "tokenizer.eos_token)"
    )
    return _tokenizer(folder, **{"tokenizer.eos_token": "<eot>"}), message


def _corrupt_tokenizer_json(tmp: Path) -> tuple[dict[str, str], str]:
    folder = train_tokenizer(tmp / "tok")
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    message = (
        f"{folder / 'tokenizer.json'}: not a tokenizer file the tokenizers library reads: EOF while parsing "
        "a value at line 1 column 28"
    )
    return _tokenizer(folder), message


def _missing_tokenizer_file(tmp: Path) -> tuple[dict[str, str], str]:
    folder = tmp / "tok"
    folder.mkdir()
    _tokenizer(folder)
    return _tokenizer(
        folder
    ), f"{folder / 'tokenizer.json'}: no tokenizer file here (expected a local tokenizer.json)"


def _vocabulary_larger_than_the_model(tmp: Path) -> tuple[dict[str, str], str]:
    folder = train_tokenizer(tmp / "tok")
    message = (
        f"{folder / 'tokenizer.json'}: the model embeds 10 token ids but the tokenizer produces 18; set "
        "model.overrides.vocab_size to at least 18"
    )
    return _tokenizer(folder, **{"model.overrides.vocab_size": "10"}), message


# -- weights -----------------------------------------------------------------------------------------------
def _weights(folder: Path) -> dict[str, str]:
    # A run from weights saves what it trains (else the launch refuses it before any file is read).
    saving = {"checkpoint.enable": "true", "checkpoint.folder": str(folder.parent / "checkpoints")}
    return {"model.weights_path": str(folder), **saving}


def _safetensors_missing(tmp: Path) -> tuple[dict[str, str], str]:
    (tmp / "w").mkdir()
    return _weights(tmp / "w"), f"{tmp / 'w'}: no *.safetensors file in model.weights_path"


def _oversized_safetensors_header(tmp: Path) -> tuple[dict[str, str], str]:
    folder = write_hf_weights(tmp / "w")
    file = folder / "model.safetensors"
    size = file.stat().st_size
    with file.open("r+b") as handle:
        handle.write((1 << 40).to_bytes(8, "little"))
    message = (
        f"{file}: not a safetensors file: its header claims {1 << 40} bytes, the file holds {size} (at most "
        "100000000 are accepted)"
    )
    return _weights(folder), message


def _header_offsets_outside_the_file(tmp: Path) -> tuple[dict[str, str], str]:
    folder = write_hf_weights(tmp / "w")
    header = json.dumps(
        {"model.norm.weight": {"dtype": "F32", "shape": [1 << 30], "data_offsets": [0, 1 << 32]}}
    )
    raw = header.encode()
    (folder / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * 16)
    message = (
        f"{folder / 'model.safetensors'}: tensor 'model.norm.weight': data offsets [0, 4294967296] lie "
        "outside the file's 16 data bytes"
    )
    return _weights(folder), message


def _int64_tensor(tmp: Path) -> tuple[dict[str, str], str]:
    def to_int(hf: dict[str, Any]) -> None:
        hf["model.norm.weight"] = hf["model.norm.weight"].to(torch.int64)

    folder = write_hf_weights(tmp / "w", to_int)
    message = (
        f"{folder / 'model.safetensors'}: tensor 'model.norm.weight' holds I64 values: weights must be "
        "floating point"
    )
    return _weights(folder), message


def _tensor_of_another_shape(tmp: Path) -> tuple[dict[str, str], str]:
    def widen(hf: dict[str, Any]) -> None:
        hf["model.norm.weight"] = torch.ones(65)

    folder = write_hf_weights(tmp / "w", widen)
    message = (
        f"{folder / 'model.safetensors'}: tensor 'model.norm.weight' has shape [65]; llama3 debugmodel "
        "expects [64]"
    )
    return _weights(folder), message


def _tensor_missing(tmp: Path) -> tuple[dict[str, str], str]:
    def drop(hf: dict[str, Any]) -> None:
        del hf["model.layers.1.mlp.down_proj.weight"]

    folder = write_hf_weights(tmp / "w", drop)
    message = f"{folder}: lacks 1 tensor(s) llama3 debugmodel has: 'model.layers.1.mlp.down_proj.weight'"
    return _weights(folder), message


def _config_json_of_another_model(tmp: Path) -> tuple[dict[str, str], str]:
    folder = write_hf_weights(tmp / "w")
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    message = (
        f"{folder / 'config.json'}: llama3 debugmodel differs from this config.json (model.flavor auto reads "
        f"it) in:\n{folder / 'config.json'}: num_hidden_layers is 3 here, llama3 debugmodel has 2; "
        "model.overrides.n_layers: 3 fits"
    )
    return _weights(folder), message


def _config_json_of_another_flavor(tmp: Path) -> tuple[dict[str, str], str]:
    from hyper_parallel.models.llama3 import LLAMA3_FLAVORS
    from hyper_parallel.models.llama3._runtime import Llama3StateDictAdapter

    folder = write_hf_weights(tmp / "w")
    file = folder / "config.json"
    file.write_text(json.dumps(Llama3StateDictAdapter(LLAMA3_FLAVORS["8B"]).hf_config()))
    fields = [
        "model.flavor '8B' fits this config.json; it differs in:",
        "vocab_size is 128256 here, llama3 debugmodel has 512; model.overrides.vocab_size: 128256 fits",
        "hidden_size is 4096 here, llama3 debugmodel has 64; model.overrides.dim: 4096 fits",
        "intermediate_size is 14336 here, llama3 debugmodel has 192; model.overrides.multiple_of: 14336 fits",
        "num_hidden_layers is 32 here, llama3 debugmodel has 2; model.overrides.n_layers: 32 fits",
        "num_attention_heads is 32 here, llama3 debugmodel has 4; model.overrides.n_heads: 32 fits",
        "num_key_value_heads is 8 here, llama3 debugmodel has 2; model.overrides.n_kv_heads: 8 fits",
        "head_dim is 128 here, llama3 debugmodel has 16",
        "max_position_embeddings is 131072 here, llama3 debugmodel has 2048; model.overrides.max_seq_len: "
        "131072 fits",
        "rope_type is 'llama3' here, llama3 debugmodel has 'default'",
    ]
    return _weights(folder), "\n".join(f"{file}: {line}" for line in fields)


CASES = {
    "record_without_the_text_field": _record_without_the_text_field,
    "empty_data": _empty_data,
    "bad_utf8": _bad_utf8,
    "folder_without_jsonl": _folder_without_jsonl,
    "record_not_an_object": _record_not_an_object,
    "missing_data_path": _missing_data_path,
    "tokenizer_without_eos_while_packing": _tokenizer_without_eos_while_packing,
    "eos_token_not_in_the_vocabulary": _eos_token_not_in_the_vocabulary,
    "corrupt_tokenizer_json": _corrupt_tokenizer_json,
    "missing_tokenizer_file": _missing_tokenizer_file,
    "vocabulary_larger_than_the_model": _vocabulary_larger_than_the_model,
    "safetensors_missing": _safetensors_missing,
    "oversized_safetensors_header": _oversized_safetensors_header,
    "header_offsets_outside_the_file": _header_offsets_outside_the_file,
    "int64_tensor": _int64_tensor,
    "tensor_of_another_shape": _tensor_of_another_shape,
    "tensor_missing": _tensor_missing,
    "config_json_of_another_model": _config_json_of_another_model,
    "config_json_of_another_flavor": _config_json_of_another_flavor,
}


@pytest.mark.parametrize("fault", list(CASES))
def test_a_bad_file_exits_2_naming_it(fault: str, tmp_path: Path) -> None:
    overrides, message = CASES[fault](tmp_path)
    status, err = launch(overrides)
    assert (status, err) == (2, message + "\n")


# -- checkpoints -------------------------------------------------------------------------------------------
def _checkpointing(folder: Path, steps: int) -> dict[str, str]:
    return {
        "checkpoint.enable": "true",
        "checkpoint.folder": str(folder),
        "checkpoint.interval": "1",
        "checkpoint.last_save_model_only": "false",
        "training.max_steps": str(steps),
        "metrics.log_freq": "1",
    }


def test_a_model_vocabulary_smaller_than_the_byte_tokenizers_is_refused_at_dry_run() -> None:
    status, err = launch({"model.overrides.vocab_size": "100"}, dry_run=True)
    assert (status, err) == (
        2,
        "--model.overrides.vocab_size: the model embeds 100 token ids but the tokenizer produces 259; set "
        "model.overrides.vocab_size to at least 259\n1 problem found; nothing was started.\n",
    )


def test_a_resume_with_another_model_shape_exits_2_naming_the_tensors(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    assert launch(_checkpointing(folder, 1)) == (0, "")
    status, err = launch({**_checkpointing(folder, 2), "model.overrides.n_layers": "3"})
    assert (status, err) == (
        2,
        f"{folder / 'step-1'}: saved with another model shape: it lacks layers.2.attention_norm.weight, "
        "layers.2.attention.wq.weight, layers.2.attention.wk.weight, layers.2.attention.wv.weight, "
        "layers.2.attention.wo.weight, layers.2.ffn_norm.weight and 3 more; resume with the model arguments "
        "it was saved with (its config.yaml), or use another checkpoint.folder\n",
    )
    initial = {"checkpoint.initial_load_path": str(folder / "step-1"), "model.overrides.dim": "32"}
    status, err = launch({**_checkpointing(tmp_path / "new", 2), **initial})
    assert status == 2
    assert err.startswith(f"{folder / 'step-1'}: saved with another model shape: tok_embeddings.weight is ")
    assert err.endswith(
        "; 15 more tensors differ; resume with the model arguments it was saved with (its "
        "config.yaml), or use another checkpoint.initial_load_path\n"
    )


def test_a_full_disk_during_a_save_exits_2_naming_enospc_and_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.checkpoint import filesystem

    write_item = filesystem._write_item

    def fill_the_disk_at_step_2(transforms: Any, stream: Any, *args: Any) -> Any:
        if ".step-2.partial" in str(getattr(stream, "name", "")):
            stream.write(b"\0" * 64)  # a partial file, as a real full disk leaves
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write_item(transforms, stream, *args)

    monkeypatch.setattr(filesystem, "_write_item", fill_the_disk_at_step_2)
    folder = tmp_path / "ckpt"
    status, err = launch(_checkpointing(folder, 2))
    assert (status, err) == (
        2,
        f"{folder}: no space left on the device (ENOSPC) while saving step 2: its partial folder was removed "
        "and the newest complete checkpoint, step 1, is kept; free space, lower checkpoint.keep_latest_k or "
        "move checkpoint.folder, then relaunch to resume\n",
    )
    assert sorted(p.name for p in folder.iterdir()) == ["step-1"]  # no partial folder, no lock left
    assert sorted(p.name for p in (folder / "step-1").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "checksums.json",
        "config.yaml",
    ]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_bad_record_under_torchrun_exits_2_on_every_rank_and_is_printed_once(tmp_path: Path) -> None:
    overrides, message = _record_without_the_text_field(tmp_path)
    flags = as_flags(
        tiny_overrides("llama3", **{"metrics.log_freq": "4", "parallelism.dp_shard": "2", **overrides})
    )
    done = torchrun(
        2, "-m", "hyper_parallel.train_lm", "--config-file", str(debug_config_path("llama3")), *flags
    )
    assert done.returncode != 0
    assert done.stderr.count(message) == 1, done.stderr[-3000:]
    failed = dict(re.findall(r"rank\s*: (\d) \(local_rank: \d\)\s*exitcode\s*: (\d+)", done.stderr))
    assert failed == {"0": "2", "1": "2"}, done.stderr[-3000:]
    # torchrun's agent prints its own traceback of the failed workers; none is a worker's (none of ours)
    assert "hyper_parallel/" not in done.stderr.replace(str(tmp_path), "")
