"""Hub ids (``org/name[@revision]``) as ``tokenizer.path`` and as a native model's ``weights_path``: found
in the Hugging Face cache (``HF_HUB_CACHE``), used as the local folder would be; not cached while
``HF_HUB_OFFLINE`` is set, refused in one line naming the id and the cache, at ``--dry-run`` too."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from hyper_parallel.components.tokenizer import HuggingFaceTokenizer
from hyper_parallel.config import load_config
from hyper_parallel.config.errors import InputFileError
from hyper_parallel.launch import main
from tests.support.components import train_tokenizer
from tests.support.hub import COMMIT, hub_cache
from tests.support.trainer import TINY_MODELS, as_flags, write_hf_weights

QUIET = ["--training.max_steps", "1", "--metrics.log_freq", "1"]
#: The tiny Llama 3 that ``write_hf_weights`` writes.
TINY = as_flags(TINY_MODELS["llama3"])


def launch(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def config(folder: Path, *, model: str = "", tokenizer: str = "ByteTokenizer.Config") -> Path:
    """A Llama 3 debug config (vocabulary 512) on the built-in corpus, saving what it trains in ``folder``."""
    text = (
        "model:\n  _target_: hyper_parallel.models.llama3.create_model_spec\n  flavor: debugmodel\n"
        f"{model}  overrides:\n    vocab_size: 512\n"
        f"tokenizer:\n  _target_: hyper_parallel.components.tokenizer.{tokenizer}\n"
        "dataloader:\n  _target_: hyper_parallel.components.dataloader.TextDataLoader.Config\n"
        "  num_workers: 0\n  dataset:\n    source: python_docs\n"
        "training:\n  _target_: hyper_parallel.trainer.config.TrainingConfig\n  seq_len: 32\n"
        "  global_batch_size: 2\n  micro_batch_size: 2\n  mixed_precision_param: float32\n"
        "lr_scheduler:\n  _target_: hyper_parallel.components.lr_scheduler.WarmupDecay.Config\n"
        "  warmup_steps: 0\n"
        "checkpoint:\n  _target_: hyper_parallel.components.checkpoint.DCPCheckpoint.Config\n"
        f"  enable: true\n  folder: {folder / 'checkpoints'}\n"
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "run.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _missing(cache: Path, hub_id: str, kind: str = "folder") -> str:
    return (
        f"{hub_id} is not a {kind} on this machine, and no Hub model of that id is in the cache "
        f"(HF_HUB_CACHE={cache}; offline)"
    )


def test_a_tokenizer_hub_id_builds_the_ids_of_the_local_folder(tmp_path: Path, offline_cache: Path) -> None:
    local = train_tokenizer(tmp_path / "tok")
    hub_cache(offline_cache, "acme/tiny-tok", lambda folder: shutil.copytree(local, folder))
    texts = ["the lazy dog", "quick fox"]
    expected = HuggingFaceTokenizer.Config(path=str(local)).build().encode_batch(texts)
    for hub_id in ("acme/tiny-tok", f"acme/tiny-tok@{COMMIT}"):
        built = HuggingFaceTokenizer.Config(path=hub_id).build()
        assert built.encode_batch(texts) == expected
        assert built.eos_id == 2
    with pytest.raises(InputFileError) as caught:
        HuggingFaceTokenizer.Config(path="acme/other").build()
    assert str(caught.value) == "tokenizer.path: " + _missing(offline_cache, "acme/other", "file or folder")


def test_a_native_weights_hub_id_passes_the_dry_run_and_trains(tmp_path: Path, offline_cache: Path) -> None:
    snapshot = hub_cache(offline_cache, "acme/tiny-llama", write_hf_weights)
    path = config(tmp_path, model="  weights_path: acme/tiny-llama\n")
    status, out, err = launch("--config-file", str(path), "--dry-run", *QUIET, *TINY)
    assert (status, err) == (0, ""), err
    status, out, err = launch("--config-file", str(path), *QUIET, *TINY)
    assert status == 0, err
    local = config(tmp_path / "local", model=f"  weights_path: {snapshot}\n")
    same = launch("--config-file", str(local), *QUIET, *TINY)
    done = [line for line in out.splitlines() if line.startswith("done: step 1, final loss")]
    assert done == [line for line in same[1].splitlines() if line.startswith("done: ")], same
    resolved = load_config(str(path))
    assert resolved.model.weights_path == str(snapshot)


def test_a_hub_id_not_cached_offline_is_one_line_naming_the_cache(
    tmp_path: Path, offline_cache: Path
) -> None:
    weights = config(tmp_path / "w", model="  weights_path: acme/other\n")
    tokenizer = config(tmp_path / "t", tokenizer="HuggingFaceTokenizer.Config\n  path: acme/other")
    cases = ((weights, "4:17: model.weights_path", "folder"), (tokenizer, "8:9: tokenizer.path", "file or folder"))
    for path, where, kind in cases:
        for dry in (["--dry-run"], []):
            status, out, err = launch("--config-file", str(path), *dry, *QUIET, *TINY)
            assert (status, out) == (2, ""), err
            assert err.splitlines() == [
                f"{path}:{where}: " + _missing(offline_cache, "acme/other", kind),
                "1 problem found; nothing was started.",
            ]
        # a config checked away from its files still resolves (the id is kept as written)
        status, out, err = launch("--config-file", str(path), "--dry-run", "--no-file-checks", *QUIET, *TINY)
        assert (status, err) == (0, ""), err
    assert load_config(str(weights)).model.weights_path == "acme/other"


def test_flavor_auto_reads_a_hub_id_at_resolve(tmp_path: Path, offline_cache: Path) -> None:
    snapshot = hub_cache(offline_cache, "acme/tiny-llama", write_hf_weights)
    path = config(tmp_path, model="  weights_path: acme/tiny-llama\n").read_text()
    path = path.replace("flavor: debugmodel", "flavor: auto").replace(
        "  overrides:\n    vocab_size: 512\n", ""
    )
    (tmp_path / "auto.yaml").write_text(path)
    spec = load_config(str(tmp_path / "auto.yaml")).model
    assert (spec.weights_path, spec.flavor, spec.args.num_layers()) == (str(snapshot), "config.json", 2)
    (tmp_path / "other.yaml").write_text(path.replace("acme/tiny-llama", "acme/other"))
    status, out, err = launch("--config-file", str(tmp_path / "other.yaml"), "--dry-run", *QUIET)
    assert (status, out) == (2, "")
    assert err.splitlines()[0] == f"{tmp_path / 'other.yaml'}:4:17: model.weights_path: " + _missing(
        offline_cache, "acme/other"
    )
