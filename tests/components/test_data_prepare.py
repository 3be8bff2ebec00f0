"""``python -m hyper_parallel.data prepare``: shards, manifest, workers, resume, inputs and their errors."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from hyper_parallel.components.tokenizer import ByteTokenizer, HuggingFaceTokenizer
from hyper_parallel.data import shards
from tests.support import ROOT
from tests.support.components import document, train_tokenizer, write_jsonl
from tests.support.prepared import folder_bytes, prepare, run_prepare, tokenizer_config
from tests.support.processes import clean_env

SMALL_SHARDS = ("--shard-mb", "0.0005")  # about 520 bytes of input per shard: several shards of a tiny file


def hf_setup(tmp_path: Path) -> tuple[Any, Path]:
    folder = train_tokenizer(tmp_path / "tok")
    return HuggingFaceTokenizer.Config(path=str(folder)).build(), tokenizer_config(tmp_path / "cfg", folder)


def test_shards_hold_each_document_as_the_config_tokenizer_encodes_it(tmp_path: Path) -> None:
    tok, config = hf_setup(tmp_path)
    data = write_jsonl(tmp_path / "train.jsonl", 40)
    out = prepare([data], tmp_path / "prep", config, *SMALL_SHARDS)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == shards.FORMAT
    assert manifest["version"] == shards.FORMAT_VERSION
    assert manifest["tokenizer"]["fingerprint"] == shards.tokenizer_fingerprint(tok)[0]
    assert manifest["inputs"] == [
        {"name": str(data), "size": data.stat().st_size, "sha256": shards.file_digest(data)}
    ]
    assert manifest["dtype"] == "uint16"
    assert len(manifest["shards"]) > 2
    corpus = shards.open_prepared(out)
    docs = []
    for arrays in corpus.shards:
        assert isinstance(arrays.tokens, np.memmap)
        assert arrays.tokens.dtype == np.uint16
        docs += [
            arrays.tokens[a:b].tolist() for a, b in zip(arrays.offsets[:-1], arrays.offsets[1:], strict=True)
        ]
        assert arrays.appended.tolist() == [0] * arrays.documents  # the encoding already ends with eos
    assert docs == [tok.encode(document(i)) for i in range(40)]
    assert (manifest["documents"], manifest["tokens"]) == (40, sum(map(len, docs)))


def test_an_encoding_without_eos_gets_one_and_the_shard_says_so(tmp_path: Path) -> None:
    config = tokenizer_config(tmp_path / "cfg")
    config.write_text(config.read_text() + "  add_eos: false\n")
    data = tmp_path / "a.txt"
    data.write_text("hi")
    corpus = shards.open_prepared(prepare([data], tmp_path / "prep", config))
    (arrays,) = corpus.shards
    assert arrays.tokens.tolist() == [256, ord("h"), ord("i"), 257]
    assert (arrays.offsets.tolist(), arrays.appended.tolist()) == ([0, 4], [1])


def test_ids_are_uint32_only_when_the_vocabulary_needs_it() -> None:
    assert shards.token_dtype(65536) == np.uint16
    assert shards.token_dtype(65537) == np.uint32


def test_text_files_folders_and_globs_are_read_in_order(tmp_path: Path) -> None:
    config = tokenizer_config(tmp_path / "cfg")
    (tmp_path / "texts" / "sub").mkdir(parents=True)
    (tmp_path / "texts" / "b.txt").write_text("bee")
    (tmp_path / "texts" / "sub" / "c.txt").write_text("sea")
    (tmp_path / "texts" / ".hidden.txt").write_text("never")
    (tmp_path / "a.txt").write_text("ay")
    out = prepare([tmp_path / "a*.txt", tmp_path / "texts"], tmp_path / "prep", config)
    corpus = shards.open_prepared(out)
    tok = ByteTokenizer.Config().build()
    tokens = np.concatenate([s.tokens for s in corpus.shards]).tolist()
    assert tokens == [t for text in ("ay", "bee", "sea") for t in tok.encode(text)]
    assert [i["name"] for i in corpus.manifest["inputs"]] == [
        str(tmp_path / p) for p in ("a.txt", "texts/b.txt", "texts/sub/c.txt")
    ]


def test_parquet_text_column(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    config = tokenizer_config(tmp_path / "cfg")
    table = pa.table({"body": ["one", "two", "three"], "n": [1, 2, 3]})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=1)
    out = prepare([tmp_path / "d.parquet"], tmp_path / "prep", config, "--text-field", "body", *SMALL_SHARDS)
    corpus = shards.open_prepared(out)
    tok = ByteTokenizer.Config().build()
    assert np.concatenate([s.tokens for s in corpus.shards]).tolist() == [
        t for text in ("one", "two", "three") for t in tok.encode(text)
    ]
    status, _, err = run_prepare(
        "prepare", tmp_path / "d.parquet", "--output", tmp_path / "p2", "--config-file", config
    )
    assert (status, err) == (2, f"{tmp_path / 'd.parquet'}: no column 'text' (columns: ['body', 'n'])\n")


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        ('{"text": "ok"}\n[1, 2]\n', "2: not a JSON object"),
        ('{"text": "ok"}\n\n{"text": \n', "3: not a JSON object: Expecting value"),
        ('{"text": "ok"}\n{"body": "x"}\n', "2: no string field 'text'"),
    ],
)
def test_bad_input_is_an_input_error_at_its_line(tmp_path: Path, lines: str, problem: str) -> None:
    config = tokenizer_config(tmp_path / "cfg")
    data = tmp_path / "data.jsonl"
    data.write_text(lines)
    status, out, err = run_prepare("prepare", data, "--output", tmp_path / "prep", "--config-file", config)
    assert (status, out, err) == (2, "", f"{data}:{problem}\n")
    assert not (tmp_path / "prep" / "manifest.json").exists()


def test_a_missing_input_names_its_path(tmp_path: Path) -> None:
    config = tokenizer_config(tmp_path / "cfg")
    gone = tmp_path / "gone.jsonl"
    status, _, err = run_prepare("prepare", gone, "--output", tmp_path / "prep", "--config-file", config)
    assert (status, err) == (2, f"{gone}: no such file or folder\n")
    status, _, err = run_prepare(
        "prepare", tmp_path / "*.jsonl", "--output", tmp_path / "p", "--config-file", config
    )
    assert (status, err) == (2, f"{tmp_path / '*.jsonl'}: no file matches this pattern\n")


def test_an_interrupted_prepare_resumes_keeping_its_finished_shards(tmp_path: Path) -> None:
    config = tokenizer_config(tmp_path / "cfg")
    data = write_jsonl(tmp_path / "train.jsonl", 60)
    whole = folder_bytes(prepare([data], tmp_path / "whole", config, *SMALL_SHARDS))
    out = prepare([data], tmp_path / "cut", config, *SMALL_SHARDS)
    (out / "manifest.json").unlink()  # as if stopped before the end: the last shards and the manifest missing
    names = sorted(p.name for p in out.glob("shard-*"))
    for name in names[2:]:
        for file in (out / name).iterdir():
            file.unlink()
        (out / name).rmdir()
    kept = {name: (out / name / "tokens.npy").stat().st_ino for name in names[:2]}
    prepare([data], out, config, *SMALL_SHARDS)
    assert folder_bytes(out) == whole
    assert {name: (out / name / "tokens.npy").stat().st_ino for name in names[:2]} == kept


def test_a_folder_of_another_prepare_is_refused(tmp_path: Path) -> None:
    config = tokenizer_config(tmp_path / "cfg")
    out = prepare([write_jsonl(tmp_path / "a.jsonl", 5)], tmp_path / "prep", config)
    status, _, err = run_prepare(
        "prepare", write_jsonl(tmp_path / "b.jsonl", 6), "--output", out, "--config-file", config
    )
    assert status == 2
    assert err.startswith(f"{out}: not empty and not an unfinished prepare of these inputs")


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_the_bytes_written_do_not_depend_on_the_workers_and_the_command_needs_no_torch(
    tmp_path: Path,
) -> None:
    config = tokenizer_config(tmp_path / "cfg")
    data = write_jsonl(tmp_path / "train.jsonl", 80)
    one = folder_bytes(prepare([data], tmp_path / "one", config, *SMALL_SHARDS))
    script = (
        "import sys\n"
        "from hyper_parallel.data.__main__ import main\n"
        "status = main(sys.argv[1:])\n"
        "assert 'torch' not in sys.modules, 'prepare imported torch'\n"
        "sys.exit(status)\n"
    )
    args = [
        "prepare",
        str(data),
        "--output",
        str(tmp_path / "two"),
        "--config-file",
        str(config),
        "--workers",
        "2",
    ]
    run = subprocess.run(
        [sys.executable, "-c", script, *args, *SMALL_SHARDS],
        cwd=ROOT,
        env=clean_env(PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "one" / "manifest.json").read_text())
    summary = f"80 documents, {manifest['tokens']:,} tokens in {len(manifest['shards'])} shard(s) (uint16)"
    assert run.stdout == f"{tmp_path / 'two'}: {summary}\n"
    assert folder_bytes(tmp_path / "two") == one
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\nnot json\n')
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "hyper_parallel.data",
            "prepare",
            str(bad),
            "--output",
            str(tmp_path / "x"),
            "--config-file",
            str(config),
        ],
        cwd=ROOT,
        env=clean_env(PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert (run.returncode, run.stderr) == (2, f"{bad}:2: not a JSON object: Expecting value\n")


def test_a_shard_encoded_in_several_units_is_the_shard_encoded_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hyper_parallel.data import prepare as module

    _, config = hf_setup(tmp_path)
    data = write_jsonl(tmp_path / "train.jsonl", 60)
    (tmp_path / "texts").mkdir()
    for i in range(5):
        (tmp_path / "texts" / f"{i}.txt").write_text(document(i) * 20)
    inputs = [data, tmp_path / "texts"]
    whole = folder_bytes(prepare(inputs, tmp_path / "whole", config))
    monkeypatch.setattr(module, "_UNIT_BYTES", 300)
    _, tasks = module.plan([str(p) for p in inputs], module.PrepareOptions())
    units = [module._units(i, pieces, 300) for i, pieces in enumerate(tasks)]
    assert len(tasks) == 2  # the jsonl's shard, the texts' shard
    assert len(units[0]) == len(tasks[0]) > 4  # the jsonl cut into pieces of about 300 bytes, a unit each
    assert 1 < len(units[1]) < 5  # the five texts in a few units
    cut = folder_bytes(prepare(inputs, tmp_path / "cut", config))
    assert {k: v for k, v in cut.items() if k.startswith("shard-")} == {
        k: v for k, v in whole.items() if k.startswith("shard-")
    }
    assert sorted(k for k in whole if k.startswith("shard-")) == [
        f"shard-0000{i}/{f}"
        for i in (0, 1)
        for f in ("appended.npy", "offsets.npy", "shard.json", "tokens.npy")
    ]
