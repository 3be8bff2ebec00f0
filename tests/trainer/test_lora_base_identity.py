"""A LoRA checkpoint names its base, and is sized by it, before the base is built again.

A tiny Llama 3 run is exported twice (two bases of the same architecture, ``base`` and ``other``); a LoRA
run from ``base`` checkpoints its adapters alone with ``base.json``. Pointing its ``config.yaml`` at
``other`` (the audit's M3) is refused by export and generate naming the record and the file that changed,
and accepted with ``--accept-changed-base``; a resume on a base updated in place is refused unless
``checkpoint.accept_changed_base``. A ``config.yaml`` describing a larger base (``vocab_size`` 2^21,
100,000 layers: M2) is refused before anything is built, and a weights folder with a 256 GiB sparse tensor
the model lacks is refused before any tensor is read (M5), each in a child process whose peak RSS stays
under 1.5 GB.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.components.checkpoint._base_record import BASE_FILE  # noqa: E402
from hyper_parallel.components.checkpoint._manifest import MANIFEST, write_manifest  # noqa: E402
from hyper_parallel.errors import InputFileError  # noqa: E402
from hyper_parallel.export import export_checkpoint  # noqa: E402
from hyper_parallel.export import main as export_main  # noqa: E402
from hyper_parallel.generate import main as generate_main  # noqa: E402
from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.peak_rss import RSS_BOUND, run_with_peak_rss  # noqa: E402
from tests.support.trainer import tiny_config  # noqa: E402

LORA = {
    "peft._target_": "hyper_parallel.components.peft.LoRA.Config",
    "peft.rank": "4",
    "optimizer.lr": "0.01",
    "tokenizer._target_": "hyper_parallel.components.tokenizer.ByteTokenizer.Config",
}
MANAGER_LOG = "hyper_parallel.components.checkpoint._manager"
#: Lines a child prints besides its own (the tiny config's warning that no metrics would be logged).
WARNED = ("/", "  return load_config", "  warnings.warn")


def _train(overrides: dict[str, str]) -> LLMTrainer:
    trainer = LLMTrainer(tiny_config("llama3", overrides))
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


def _lora(base: Path, folder: Path, steps: int, **more: str) -> dict[str, str]:
    return {
        **LORA,
        "checkpoint.enable": "true",
        "checkpoint.folder": str(folder),
        "checkpoint.interval": "1",
        "checkpoint.keep_latest_k": "0",
        "checkpoint.last_save_model_only": "false",
        "training.max_steps": str(steps),
        "model.weights_path": str(base),
        **more,
    }


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two bases of one architecture (seeds 1 and 2) and a 2-step LoRA run from the first."""
    tmp = tmp_path_factory.mktemp("lora-base")
    bases = {}
    for name, seed in (("base", "1"), ("other", "2")):
        _train({"training.max_steps": "1", "training.seed": seed, **_saving(tmp / f"{name}-ckpt")})
        bases[name] = export_checkpoint(tmp / f"{name}-ckpt", tmp / name)
    _train(_lora(bases["base"], tmp / "ckpt", 2))
    return {**bases, "ckpt": tmp / "ckpt", "tmp": tmp}


def _saving(folder: Path) -> dict[str, str]:
    return {"checkpoint.enable": "true", "checkpoint.folder": str(folder)}


@pytest.fixture
def ckpt(made: dict[str, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(made["ckpt"], tmp_path / "ckpt"))


def _edit_config(step: Path, old: str, new: str) -> None:
    """``old`` replaced by ``new`` in ``step``'s config.yaml, the manifest forged (a hostile folder)."""
    text = (step / "config.yaml").read_text()
    assert old in text, old
    (step / "config.yaml").write_text(text.replace(old, new))
    write_manifest(step)


def test_every_checkpoint_records_its_base_under_the_manifest(made: dict[str, Path]) -> None:
    step = made["ckpt"] / "step-2"
    record = json.loads((step / BASE_FILE).read_text())
    assert record["weights_path"] == str(made["base"])
    (name,) = record["files"]
    assert name == "model.safetensors"
    entry = record["files"][name]
    assert entry["size"] == (made["base"] / name).stat().st_size
    assert len(entry["header_sha256"]) == len(entry["sampled_sha256"]) == 64
    assert isinstance(record["parameters"], int)
    assert record["parameters"] > 0
    assert BASE_FILE in json.loads((step / MANIFEST).read_text())["files"]


def test_export_and_generate_refuse_another_base_and_accept_it_when_told(
    made: dict[str, Path], ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    step = ckpt / "step-2"
    _edit_config(step, f"weights_path: {made['base']}\n", f"weights_path: {made['other']}\n")
    problem = (
        f"{step / BASE_FILE}: model.weights_path {str(made['other'])!r} is not the frozen base this "
        "checkpoint's adapters were trained on (model.safetensors: its values differ); pass "
        "--accept-changed-base (accept_changed_base=True) to use it anyway"
    )
    capsys.readouterr()
    assert export_main([str(step), str(tmp_path / "hf")]) == 2
    assert capsys.readouterr().err == f"export: {problem}\n"
    assert not (tmp_path / "hf").exists()
    assert generate_main([str(step), "--prompt", "ab", "--max-new-tokens", "1"]) == 2
    assert capsys.readouterr().err == f"generate: {problem}\n"
    assert export_main([str(step), str(tmp_path / "hf"), "--accept-changed-base"]) == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_a_resume_on_a_base_updated_in_place_is_refused_unless_accepted(
    made: dict[str, Path], ckpt: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = Path(shutil.copytree(made["base"], tmp_path / "base"))
    shutil.copyfile(made["other"] / "model.safetensors", base / "model.safetensors")  # same layout
    overrides = _lora(made["base"], ckpt, 3, **{"model.weights_path": str(base)})
    with pytest.raises(InputFileError) as refused:
        LLMTrainer(tiny_config("llama3", overrides))
    assert str(refused.value) == (
        f"{ckpt / 'step-2' / BASE_FILE}: model.weights_path {str(base)!r} is not the frozen base this "
        "checkpoint's adapters were trained on (model.safetensors: its values differ); set "
        "checkpoint.accept_changed_base: true to load them on it anyway"
    )
    with caplog.at_level(logging.WARNING, logger=MANAGER_LOG):
        trainer = _train({**overrides, "checkpoint.accept_changed_base": "true"})
    assert trainer.resumed_from == 2
    assert "(model.safetensors: its values differ): accepted" in caplog.text


def test_a_resume_on_the_same_base_moved_elsewhere_is_accepted(
    made: dict[str, Path], ckpt: Path, tmp_path: Path
) -> None:
    """The identity is the files' content, not the folder's name."""
    moved = Path(shutil.copytree(made["base"], tmp_path / "moved"))
    trainer = _train(_lora(moved, ckpt, 3))
    assert trainer.resumed_from == 2


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("old", "new"), [("vocab_size: 512\n", "vocab_size: 2097152\n"), ("n_layers: 2\n", "n_layers: 100000\n")]
)
def test_a_lora_config_larger_than_its_base_is_refused_before_building(
    made: dict[str, Path], ckpt: Path, tmp_path: Path, old: str, new: str
) -> None:
    step = ckpt / "step-2"
    _edit_config(step, old, new)
    status, err, peak = run_with_peak_rss("export", [str(step), str(tmp_path / "hf")])
    assert status == 2, err[-2000:]
    (line,) = [line for line in err.splitlines() if not line.startswith(WARNED)]  # one line, no traceback
    assert line.startswith(f"export: {made['base']}: its config describes a model of "), err
    assert " parameters and the weights store " in line
    assert peak < RSS_BOUND, f"peak RSS {peak >> 20} MiB"


def _sparse_tensor_file(path: Path, name: str, gib: int) -> None:
    """A safetensors file holding one float32 tensor of ``gib`` GiB, all of it a hole (a few KB stored)."""
    nbytes = gib << 30
    header = json.dumps(
        {name: {"dtype": "F32", "shape": [nbytes // 4], "data_offsets": [0, nbytes]}}
    ).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as stream:
        stream.write(struct.pack("<Q", len(header)) + header)
        stream.truncate(8 + len(header) + nbytes)


@pytest.mark.multiprocess
def test_a_256_gib_sparse_tensor_the_model_lacks_is_refused_before_any_tensor_is_read(
    made: dict[str, Path], tmp_path: Path
) -> None:
    folder = Path(shutil.copytree(made["other"], tmp_path / "hf"))
    _sparse_tensor_file(folder / "extra.safetensors", "extra.weight", 256)
    status, err, peak = run_with_peak_rss(
        "generate", [str(folder), "--prompt", "ab", "--max-new-tokens", "1"]
    )
    assert status == 2, err[-2000:]
    (line,) = [line for line in err.splitlines() if not line.startswith(WARNED)]
    assert line == (
        f"generate: {folder}: these weights do not fit llama3 config.json: unexpected names in the Hugging "
        "Face Llama state dict: ['extra.weight']"
    )
    assert peak < RSS_BOUND, f"peak RSS {peak >> 20} MiB"
