"""``--dry-run`` checks the files a config names as the launch does, and refuses them with the launch's words.

Each case runs the dry-run and then the launch itself (in process, on the same config) and asserts that the
two print the same refusal, exit 2: whatever the run would reject a second after it starts is refused by
the dry-run first (issue 35). ``--no-file-checks`` leaves the files out, for a config checked away from them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from tests.support.components import train_tokenizer, write_jsonl
from tests.support.prepared import prepare, tokenizer_config
from tests.support.processes import clean_env
from tests.support.trainer import QUIET, TINY_MODELS, as_flags, launch, llama_run_config, write_hf_weights

LLAMA = "hyper_parallel.models.llama3.create_model_spec"
TEXT = "hyper_parallel.components.dataloader.TextDataLoader.Config"
#: The tiny Llama 3 that ``write_hf_weights`` writes, as flags over ``config``'s debug model.
TINY = as_flags(TINY_MODELS["llama3"])


def refused_alike(path: Path, *flags: str) -> str:
    """The refusal of the dry-run, asserted to be the launch's own, word for word (exit 2 both)."""
    dry = launch("--config-file", str(path), "--dry-run", *QUIET, *flags)
    run = launch("--config-file", str(path), *QUIET, *flags)
    assert (dry[0], run[0]) == (2, 2), (dry, run)
    assert dry[1] == ""  # no summary: nothing was started
    assert dry[2] == run[2]
    assert "Traceback" not in dry[2]
    return dry[2]


def test_a_data_path_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    path = llama_run_config(tmp_path, data=f"    source: jsonl\n    paths: [{missing}]\n")
    assert refused_alike(path) == (  # at the position the path was given: line 13, column 13
        f"{path}:13:13: dataloader.dataset.paths[0]: {str(missing)!r} does not exist on this machine\n"
        "1 problem found; nothing was started.\n"
    )


def test_a_weights_path_that_is_not_a_folder(tmp_path: Path) -> None:
    weights = tmp_path / "weights.safetensors"
    weights.write_bytes(b"")
    path = llama_run_config(tmp_path, data="    source: python_docs\n", model=f"  weights_path: {weights}\n")
    assert refused_alike(path) == (
        f"{path}:4:17: model.weights_path: {str(weights)!r} is not a directory on this machine\n"
        "1 problem found; nothing was started.\n"
    )


def test_a_file_check_names_the_flag_that_gave_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    weights = tmp_path / "weights"
    path = llama_run_config(tmp_path, data="    source: jsonl\n    paths: [a.jsonl]\n")
    flags = ["--dataloader.dataset.paths", f"[{missing}]", "--model.weights_path", str(weights)]
    flags += ["--checkpoint.enable", "true", "--checkpoint.folder", str(tmp_path / "checkpoints")]
    assert refused_alike(path, *flags) == (
        f"--dataloader.dataset.paths: dataloader.dataset.paths[0]: {str(missing)!r} does not exist on this "
        "machine\n"
        f"--model.weights_path: {str(weights)!r} is not a directory on this machine\n"
        "2 problems found; nothing was started.\n"
    )


def _no_config_json(folder: Path) -> str:
    (folder / "config.json").unlink()
    return (
        f"{folder / 'config.json'}: does not exist: model.weights_path is checked against the config.json "
        "every Hugging Face weights folder holds beside its *.safetensors files"
    )


def _config_json_of_another_depth(folder: Path) -> str:
    file = folder / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), "num_hidden_layers": 3}))
    return (
        f"{file}: llama3 debugmodel differs from this config.json (model.flavor auto reads it) in:\n"
        f"{file}: num_hidden_layers is 3 here, llama3 debugmodel has 2; model.overrides.n_layers: 3 fits"
    )


def _tensor_missing(folder: Path) -> str:
    from safetensors.torch import load_file, save_file

    file = folder / "model.safetensors"
    tensors = load_file(str(file))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(file))
    return f"{folder}: lacks 1 tensor(s) llama3 debugmodel has: 'model.layers.1.mlp.down_proj.weight'"


def _tensor_of_another_shape(folder: Path) -> str:
    from safetensors.torch import load_file, save_file

    file = folder / "model.safetensors"
    tensors = load_file(str(file))
    query = tensors["model.layers.0.self_attn.q_proj.weight"]
    tensors["model.layers.0.self_attn.k_proj.weight"] = query.clone()
    save_file(tensors, str(file))
    return (
        f"{file}: tensor 'model.layers.0.self_attn.k_proj.weight' has shape [64, 64]; llama3 debugmodel "
        "expects [32, 64]"
    )


def _damaged_header(folder: Path) -> str:
    file = folder / "model.safetensors"
    size = file.stat().st_size
    with file.open("r+b") as handle:
        handle.write((1 << 40).to_bytes(8, "little"))
    return (
        f"{file}: not a safetensors file: its header claims {1 << 40} bytes, the file holds {size} (at most "
        "100000000 are accepted)"
    )


WEIGHTS_FAULTS = {
    "no_config_json": _no_config_json,
    "config_json_of_another_depth": _config_json_of_another_depth,
    "tensor_missing": _tensor_missing,
    "tensor_of_another_shape": _tensor_of_another_shape,
    "damaged_header": _damaged_header,
}


@pytest.mark.parametrize("fault", list(WEIGHTS_FAULTS))
def test_a_weights_folder_that_does_not_fit_the_model(fault: str, tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    folder = write_hf_weights(tmp_path / "weights")
    path = llama_run_config(tmp_path, data="    source: python_docs\n", model=f"  weights_path: {folder}\n")
    assert launch("--config-file", str(path), "--dry-run", *QUIET, *TINY)[0] == 0  # the folder as written
    message = WEIGHTS_FAULTS[fault](folder)
    assert refused_alike(path, *TINY) == f"{message}\n"


def test_a_jsonl_file_whose_first_record_is_not_an_object(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text("[1, 2]\n")
    path = llama_run_config(tmp_path, data=f"    source: jsonl\n    paths: [{data}]\n")
    message = refused_alike(path)
    assert message.startswith(f"{data}:1: ")
    assert "not a JSON object" in message


def test_a_tokenizer_with_more_ids_than_the_model_embeds(tmp_path: Path) -> None:
    folder = train_tokenizer(tmp_path / "tok")
    corpus = write_jsonl(tmp_path / "train.jsonl", 8)
    path = llama_run_config(
        tmp_path,
        data=f"    source: jsonl\n    paths: [{corpus}]\n",
        tokenizer=f"HuggingFaceTokenizer.Config\n  path: {folder}",
    )
    size = len(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"])
    message = refused_alike(path, "--model.overrides.vocab_size", "8")
    assert f"the model embeds 8 token ids but the tokenizer produces {size}" in message
    assert launch("--config-file", str(path), "--dry-run", *QUIET)[0] == 0  # it fits the 512 of the config


def test_a_tokenizer_whose_model_max_length_is_below_seq_len(tmp_path: Path) -> None:
    # It used to pass --dry-run and end the launch in the data loader's traceback (exit 1).
    folder = train_tokenizer(tmp_path / "tok")
    saved = folder / "tokenizer_config.json"
    saved.write_text(json.dumps({**json.loads(saved.read_text()), "model_max_length": 16}))
    corpus = write_jsonl(tmp_path / "train.jsonl", 8)
    path = llama_run_config(
        tmp_path,
        data=f"    source: jsonl\n    paths: [{corpus}]\n",
        tokenizer=f"HuggingFaceTokenizer.Config\n  path: {folder}",
    )
    assert refused_alike(path) == (  # the file's value: located at the tokenizer the config names
        f"{folder / 'tokenizer.json'}: training.seq_len 32 exceeds its tokenizer_config.json's "
        "model_max_length (16); lower training.seq_len, or set tokenizer.model_max_length to at least 32 if "
        "the model takes sequences that long\n"
    )
    # The config's own value is refused at resolve, located at the seq_len that exceeds it.
    assert refused_alike(path, "--tokenizer.model_max_length", "31") == (
        f"{path}:17:12: training.seq_len: 32 exceeds tokenizer.model_max_length (31); lower "
        "training.seq_len, or set tokenizer.model_max_length to at least 32 if the model takes sequences "
        "that long\n1 problem found; nothing was started.\n"
    )
    # Raised by the config, the file's value no longer bounds the run.
    raised = launch("--config-file", str(path), "--dry-run", *QUIET, "--tokenizer.model_max_length", "32")
    assert raised[0] == 0


def test_a_prepared_folder_of_another_tokenizer(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "train.jsonl", 8)
    folder = prepare([corpus], tmp_path / "prepared", tokenizer_config(tmp_path / "prep"))
    path = llama_run_config(tmp_path, data=f"    source: tokenized\n    paths: [{folder}]\n")
    assert launch("--config-file", str(path), "--dry-run", *QUIET)[0] == 0  # prepared with this tokenizer
    message = refused_alike(path, "--tokenizer.add_bos", "false")
    assert message.startswith(f"{folder}/manifest.json: dataset.paths: prepared with tokenizer ")


def test_a_dry_run_counts_the_epochs_of_prepared_folders_as_the_trainer_does(tmp_path: Path) -> None:
    from hyper_parallel.config import load_config
    from hyper_parallel.trainer import LLMTrainer

    corpus = write_jsonl(tmp_path / "train.jsonl", 40)
    folder = prepare([corpus], tmp_path / "prepared", tokenizer_config(tmp_path / "prep"))
    data = f"    source: tokenized\n    paths: [{folder}]\n    holdout_fraction: 0.25\n"
    path = llama_run_config(tmp_path, data=data)
    by_epochs = {"training.max_steps": "null", "training.epochs": "3", "metrics.log_freq": "1"}
    trainer = LLMTrainer(load_config(path, by_epochs))
    try:
        per_epoch, steps = trainer.samples_per_epoch, trainer.max_steps
        samples = len(trainer.dataloader.samples)  # drop_last (the default) leaves the 19th out
    finally:
        trainer.close()
    assert (samples, per_epoch) == (19, 18)  # 612 tokens of the first 30 documents, in windows of 32
    assert steps == -(-3 * per_epoch // 2)

    def told(*flags: str) -> str:
        status, out, err = launch("--config-file", str(path), "--dry-run", "--metrics.log_freq", "1", *flags)
        assert status == 0, err
        return next(line for line in out.splitlines() if line.startswith("length: "))

    ranks = "1 data-parallel rank; world size not given: each auto degree counted as 1"
    held = f"{samples} samples at seq_len 32, {ranks}"
    assert told("--training.max_steps", "7") == (
        f"length: 7 steps (training.max_steps) x global batch 2 = {7 * 2 / per_epoch:.4g} epochs of "
        f"{per_epoch} samples ({held})"
    )
    assert told(*as_flags(by_epochs)) == (
        f"length: {steps} steps (training.epochs 3) x global batch 2 = {steps * 2 / per_epoch:.4g} epochs of "
        f"{per_epoch} samples ({held})"
    )
    assert told("--no-file-checks", "--training.max_steps", "7") == (
        "length: 7 steps; the epochs they cover are counted at launch: the files are not read "
        "(--no-file-checks)"
    )


def test_no_file_checks_leaves_the_files_out_of_a_dry_run_only(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    path = llama_run_config(tmp_path, data=f"    source: jsonl\n    paths: [{missing}]\n")
    status, out, err = launch("--config-file", str(path), "--dry-run", "--no-file-checks", *QUIET)
    assert (status, err) == (0, "")
    assert out
    status, _, err = launch("--config-file", str(path), "--no-file-checks", *QUIET)
    assert (status, err.splitlines()[0]) == (
        2,
        "--no-file-checks: only leaves files out of a --dry-run; add --dry-run",
    )


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_the_file_checks_of_a_dry_run_import_no_torch(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "train.jsonl", 8)
    folder = prepare([corpus], tmp_path / "prepared", tokenizer_config(tmp_path / "prep"))
    sections = f"    source: tokenized\n    paths: [{folder}]\n"
    weights = write_hf_weights(tmp_path / "weights")  # its headers and config.json checked without torch
    path = llama_run_config(tmp_path, data=sections, model=f"  weights_path: {weights}\n")
    code = (
        "import sys; from hyper_parallel.launch import main; status = main(sys.argv[1:]); "
        "print(status, 'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "--config-file", str(path), "--dry-run", *QUIET, *TINY],
        capture_output=True,
        text=True,
        timeout=100,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert done.stdout.splitlines()[-1] == "0 False", done.stderr
