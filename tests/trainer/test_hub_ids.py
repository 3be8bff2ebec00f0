"""Hub ids (``org/name[@revision]``) as ``tokenizer.path`` and as a native model's ``weights_path``: found
in the Hugging Face cache (``HF_HUB_CACHE``), used as the local folder would be; not cached while
``HF_HUB_OFFLINE`` is set, refused in one line naming the id and the cache, at ``--dry-run`` too."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from hyper_parallel.components.tokenizer import HuggingFaceTokenizer
from hyper_parallel.config.errors import InputFileError
from tests.support.components import train_tokenizer
from tests.support.hub import COMMIT, hub_cache
from tests.support.trainer import write_hf_weights
from tests.trainer.test_dry_run_files import QUIET, TINY, config, launch


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _missing(cache: Path, hub_id: str) -> str:
    return f"{hub_id}: not in the Hugging Face cache {cache} (HF_HUB_OFFLINE is set: nothing is downloaded)"


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
    assert str(caught.value) == _missing(offline_cache, "acme/other")


def test_a_native_weights_hub_id_passes_the_dry_run_and_trains(tmp_path: Path, offline_cache: Path) -> None:
    snapshot = hub_cache(offline_cache, "acme/tiny-llama", write_hf_weights)
    path = config(tmp_path, data="    source: python_docs\n", model="  weights_path: acme/tiny-llama\n")
    status, out, err = launch("--config-file", str(path), "--dry-run", *QUIET, *TINY)
    assert (status, err) == (0, ""), err
    status, out, err = launch("--config-file", str(path), *QUIET, *TINY)
    assert status == 0, err
    (tmp_path / "local").mkdir()
    local = config(
        tmp_path / "local", data="    source: python_docs\n", model=f"  weights_path: {snapshot}\n"
    )
    same = launch("--config-file", str(local), *QUIET, *TINY)
    done = [line for line in out.splitlines() if line.startswith("done: step 1, final loss")]
    assert done == [line for line in same[1].splitlines() if line.startswith("done: ")], same
    from hyper_parallel.config import load_config

    resolved = load_config(str(path), [])
    assert resolved.model.weights_path == str(snapshot)


def test_a_native_weights_hub_id_not_cached_offline_is_one_line(tmp_path: Path, offline_cache: Path) -> None:
    path = config(tmp_path, data="    source: python_docs\n", model="  weights_path: acme/other\n")
    for dry in (["--dry-run"], []):
        status, out, err = launch("--config-file", str(path), *dry, *QUIET, *TINY)
        assert (status, out) == (2, ""), err
        assert err.splitlines()[0] == f"{path}:4:17: model.weights_path: " + _missing(
            offline_cache, "acme/other"
        )


def test_a_tokenizer_hub_id_not_cached_offline_is_refused_alike(tmp_path: Path, offline_cache: Path) -> None:
    path = config(
        tmp_path,
        data="    source: python_docs\n",
        tokenizer="HuggingFaceTokenizer.Config\n  path: acme/other",
    )
    for dry in (["--dry-run"], []):
        status, out, err = launch("--config-file", str(path), *dry, *QUIET, *TINY)
        assert (status, out, err) == (2, "", _missing(offline_cache, "acme/other") + "\n")
