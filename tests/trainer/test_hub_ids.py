"""Hub ids (``org/name[@revision]``) as ``tokenizer.path`` and as a native model's ``weights_path``: found
in the Hugging Face cache (``HF_HUB_CACHE``), used as the local folder would be; not cached while
``HF_HUB_OFFLINE`` is set, refused in one line naming the id and the cache, at ``--dry-run`` too."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from hyper_parallel.components.tokenizer import HuggingFaceTokenizer
from hyper_parallel.config import load_config
from hyper_parallel.errors import InputFileError
from tests.support.components import train_tokenizer
from tests.support.hub import COMMIT, hub_cache
from tests.support.trainer import QUIET, TINY_MODELS, as_flags, launch, llama_run_config, write_hf_weights

#: The tiny Llama 3 that ``write_hf_weights`` writes.
TINY = as_flags(TINY_MODELS["llama3"])


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture
def online_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hub cache, online: the tests stand in for the Hub's answers (``snapshot_download``)."""
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
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
    path = llama_run_config(tmp_path, model="  weights_path: acme/tiny-llama\n")
    status, out, err = launch("--config-file", str(path), "--dry-run", *QUIET, *TINY)
    assert (status, err) == (0, ""), err
    status, out, err = launch("--config-file", str(path), *QUIET, *TINY)
    assert status == 0, err
    local = llama_run_config(tmp_path / "local", model=f"  weights_path: {snapshot}\n")
    same = launch("--config-file", str(local), *QUIET, *TINY)
    done = [line for line in out.splitlines() if line.startswith("done: step 1, final loss")]
    assert done == [line for line in same[1].splitlines() if line.startswith("done: ")], same
    resolved = load_config(str(path))
    assert resolved.model.weights_path == str(snapshot)


def test_a_hub_id_not_cached_offline_is_one_line_naming_the_cache(
    tmp_path: Path, offline_cache: Path
) -> None:
    weights = llama_run_config(tmp_path / "w", model="  weights_path: acme/other\n")
    tokenizer = llama_run_config(
        tmp_path / "t", tokenizer="HuggingFaceTokenizer.Config\n  path: acme/other", save=True
    )
    cases = (
        (weights, "4:17: model.weights_path", "folder"),
        (tokenizer, "8:9: tokenizer.path", "file or folder"),
    )
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
    path = llama_run_config(tmp_path, model="  weights_path: acme/tiny-llama\n").read_text()
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


def test_a_missing_weights_folder_of_flavor_auto_is_one_problem_at_the_dry_run(
    tmp_path: Path, offline_cache: Path
) -> None:
    text = (
        llama_run_config(tmp_path, model="  weights_path: WEIGHTS\n")
        .read_text()
        .replace("  flavor: debugmodel\n", "")
    )
    for weights, kind in ((str(tmp_path / "none"), "absolute"), ("acme/not-made-yet", "hub")):
        path = tmp_path / f"{kind}.yaml"
        path.write_text(text.replace("WEIGHTS", weights))
        status, out, err = launch("--config-file", str(path), "--dry-run", *QUIET)
        assert (status, out) == (2, ""), err
        absent = f"{weights!r} is not a directory on this machine"
        problem = absent if kind == "absolute" else _missing(offline_cache, weights)
        assert err.splitlines() == [
            f"{path}:3:17: model.weights_path: {problem}",
            "1 problem found; nothing was started.",
        ]


def test_a_named_flavor_the_folder_disagrees_with_is_one_report_of_the_differing_fields(
    tmp_path: Path,
) -> None:
    weights = write_hf_weights(tmp_path / "weights")
    path = llama_run_config(tmp_path, model=f"  weights_path: {weights}\n")
    status, out, err = launch("--config-file", str(path), "--dry-run", *QUIET)
    file = weights / "config.json"
    assert (status, out) == (2, "")
    assert err.splitlines() == [
        f"{file}: llama3 debugmodel differs from this config.json (model.flavor auto reads it) in:",
        f"{file}: hidden_size is 64 here, llama3 debugmodel has 256; model.overrides.dim: 64 fits",
        f"{file}: intermediate_size is 192 here, llama3 debugmodel has 704",
        f"{file}: num_hidden_layers is 2 here, llama3 debugmodel has 4; model.overrides.n_layers: 2 fits",
        f"{file}: num_attention_heads is 4 here, llama3 debugmodel has 8; model.overrides.n_heads: 4 fits",
        f"{file}: num_key_value_heads is 2 here, llama3 debugmodel has 4; model.overrides.n_kv_heads: 2 fits",
        f"{file}: head_dim is 16 here, llama3 debugmodel has 32; model.overrides.n_heads: 16 fits",
    ]
    # the flavor left out: auto reads the folder, and the same dry-run passes
    (tmp_path / "auto.yaml").write_text(path.read_text().replace("  flavor: debugmodel\n", ""))
    status, out, err = launch("--config-file", str(tmp_path / "auto.yaml"), "--dry-run", *QUIET)
    assert (status, err) == (0, ""), err
    assert load_config(str(tmp_path / "auto.yaml")).model.flavor == "config.json"


@pytest.mark.parametrize(
    ("path", "hub"),
    [
        ("acme/tiny-llama", True),
        ("acme/tiny-llama@main", True),
        ("acme/tiny-llama@refs/pr/1", True),
        ("runs/qwen3_5_debug_hf", True),  # may be a folder not made yet: a refusal names both readings
        ("/abs/tiny-llama", False),
        ("./acme/tiny-llama", False),
        ("~/tiny-llama", False),
        ("runs/a/b", False),
        ("tiny-llama", False),
        ("acme/tiny--llama", False),
        ("acme/tiny..llama", False),
        ("acme/tiny-llama.", False),
        ("acme/tiny llama", False),
    ],
)
def test_only_a_missing_org_name_that_is_a_valid_repo_id_is_a_hub_id(path: str, hub: bool) -> None:
    from hyper_parallel._hub import is_hub_id

    assert is_hub_id(path) is hub


def test_an_existing_path_of_hub_id_shape_is_a_local_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hyper_parallel._hub import is_hub_id

    monkeypatch.chdir(tmp_path)
    (tmp_path / "acme" / "tiny-llama").mkdir(parents=True)
    assert not is_hub_id("acme/tiny-llama")


def _refused(kind: type[Exception]) -> Exception:
    """One of huggingface_hub's HTTP errors without a response (what the tests need of it: its class)."""
    error = kind.__new__(kind)
    Exception.__init__(error, "404 Client Error")
    return error


def test_online_the_hubs_answer_is_one_line_after_the_local_reading(
    online_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    from hyper_parallel._hub import CONFIG_FILES, lookup_problem, snapshot

    answer: list[Exception] = []

    def hub(*args: object, local_files_only: bool = False, **kwargs: object) -> str:
        if local_files_only:
            raise FileNotFoundError("not cached")  # as huggingface_hub says it (LocalEntryNotFoundError)
        raise answer[0]

    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    hub_page = "https://huggingface.co/acme/x"
    expected = [
        (
            "acme/x",
            RepositoryNotFoundError,
            "answers: not found (no model of that id, or a private one: hf auth login)",
        ),
        ("acme/x", GatedRepoError, f"answers: gated (accept its terms at {hub_page}, then hf auth login)"),
        ("acme/x@v9", RevisionNotFoundError, "answers: acme/x has no revision 'v9'"),
        ("acme/x", ConnectionError, "cannot be asked (404 Client Error)"),
    ]
    for hub_id, kind, said in expected:
        answer[:] = [_refused(kind)]
        line = f"{hub_id} is not a folder on this machine, and the Hugging Face Hub {said}"
        assert lookup_problem(hub_id, CONFIG_FILES) == line
        with pytest.raises(ValueError, match="Hugging Face Hub") as caught:
            snapshot(hub_id, CONFIG_FILES)
        assert str(caught.value) == line


def test_flavor_auto_of_a_hub_id_fetched_by_the_launch_is_read_then(
    tmp_path: Path, online_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    real = huggingface_hub.snapshot_download
    fetched: list[object] = []

    def hub(repo: str, *args: object, local_files_only: bool = False, **kwargs: Any) -> Any:
        if not (local_files_only or kwargs.get("dry_run")):  # "downloads" the whole repository once
            if not fetched:
                hub_cache(online_cache, repo, write_hf_weights)
            fetched.append(kwargs.get("allow_patterns"))
        return real(repo, *args, local_files_only=True, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    text = llama_run_config(tmp_path, model="  weights_path: acme/tiny-llama\n").read_text()
    path = tmp_path / "auto.yaml"
    path.write_text(
        text.replace("  flavor: debugmodel\n", "").replace("  overrides:\n    vocab_size: 512\n", "")
    )
    assert load_config(str(path)).model.flavor_unread  # the resolve never asks the Hub
    status, out, err = launch("--config-file", str(path), *QUIET)
    assert (status, err) == (0, ""), err
    assert fetched[0] == ["config.json"]  # by the file checks, then the weights by rank 0's
    assert out.count("done: step 1") == 1


def test_a_trainer_built_from_a_config_whose_flavor_is_unread_says_to_resolve_it_again(
    tmp_path: Path,
) -> None:
    from hyper_parallel.trainer import LLMTrainer

    missing = tmp_path / "weights"
    text = llama_run_config(tmp_path, model=f"  weights_path: {missing}\n").read_text()
    (tmp_path / "auto.yaml").write_text(text.replace("  flavor: debugmodel\n", ""))
    cfg = load_config(str(tmp_path / "auto.yaml"))
    write_hf_weights(missing)  # there now, after the resolve
    with pytest.raises(InputFileError) as caught:
        LLMTrainer(cfg)
    assert str(caught.value) == (
        f"model.weights_path: {missing} was not on this machine when the config was resolved (flavor auto "
        "has not read its config.json, a Hub id is not in the cache): fetch it, then resolve the config "
        "again (train_lm does both)"
    )
    assert load_config(str(tmp_path / "auto.yaml")).model.flavor == "config.json"


def test_online_a_dry_run_asks_the_hub_and_downloads_nothing_and_the_launch_fetches_with_a_named_flavor(
    tmp_path: Path, online_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import huggingface_hub

    real = huggingface_hub.snapshot_download
    downloads: list[object] = []

    class Planned:  # what huggingface_hub's dry run lists of a file
        will_download, file_size = True, 2_000_000

    def hub(repo: str, *args: object, local_files_only: bool = False, **kwargs: Any) -> Any:
        if kwargs.get("dry_run"):
            return [Planned()] if not downloads else []
        if not local_files_only:
            downloads.append(kwargs.get("allow_patterns"))
            hub_cache(online_cache, repo, write_hf_weights)
        return real(repo, *args, local_files_only=True, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    # flavor debugmodel, vocabulary 512
    path = llama_run_config(tmp_path, model="  weights_path: acme/tiny-llama\n")
    status, out, err = launch("--config-file", str(path), "--dry-run", *QUIET, *TINY)
    assert (status, err, downloads) == (0, "", []), err
    assert capsys.readouterr().err.splitlines() == [  # (the file checks' notes go to the process's stderr)
        f"note: acme/tiny-llama: the launch downloads 1 file(s), 2.0 MB, into {online_cache}",
    ]
    status, out, err = launch("--config-file", str(path), *QUIET, *TINY)
    assert (status, err) == (0, ""), err
    assert downloads[0] == ["config.json"]  # the file checks, then the weights by rank 0
    assert out.count("done: step 1") == 1


def test_online_a_dry_run_says_what_a_tokenizer_hub_id_would_download(
    tmp_path: Path, online_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import huggingface_hub

    class Planned:  # what huggingface_hub's dry run lists of a file
        will_download, file_size = True, 500_000

    def hub(repo: str, *args: object, local_files_only: bool = False, **kwargs: Any) -> Any:
        if kwargs.get("dry_run"):
            return [Planned(), Planned()]
        if local_files_only:
            raise FileNotFoundError("not cached")
        raise AssertionError("a dry run downloaded")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    path = llama_run_config(
        tmp_path, tokenizer="HuggingFaceTokenizer.Config\n  path: acme/tiny-tok", save=True
    )
    status, out, err = launch("--config-file", str(path), "--dry-run", *QUIET, *TINY)
    assert (status, err) == (0, ""), err
    assert "preflight:" in out
    assert capsys.readouterr().err.splitlines() == [
        f"note: acme/tiny-tok: the launch downloads 2 file(s), 1.0 MB, into {online_cache}"
    ]
