"""The ``python_docs`` dataset source: standard-library docstrings as real text, with no files or network."""

import json
import os
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.components.dataloader import LoaderRequest, PythonDocsSource, TextDataLoader  # noqa: E402
from hyper_parallel.components.dataloader._sources import python_docs  # noqa: E402
from hyper_parallel.components.tokenizer import ByteTokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

# Collect the documents in a fresh interpreter that fails on any socket use, and time the collection.
_PROBE = """
import hashlib, json, sys, time

def no_network(event, args):
    if event.startswith("socket.") or event == "urllib.Request":
        raise RuntimeError(f"network use: {event}")

sys.addaudithook(no_network)
from hyper_parallel.components.dataloader._sources import python_docs
start = time.perf_counter()
docs = python_docs()
seconds = time.perf_counter() - start
digest = hashlib.sha256("\\x00".join(docs).encode()).hexdigest()
print(json.dumps({"seconds": seconds, "count": len(docs), "digest": digest}))
"""


def test_documents_are_named_non_empty_docstrings() -> None:
    docs = python_docs()
    assert 1000 < len(docs) < 5000
    assert 200_000 < sum(map(len, docs)) < 2_000_000
    for doc in docs:
        name, blank, body = doc.partition("\n\n")
        assert blank
        assert name
        assert " " not in name
        assert body.strip()
    names = [doc.partition("\n")[0] for doc in docs]
    assert names[0] == "abc"
    assert {"json.dumps", "collections.OrderedDict", "pathlib.Path.resolve"} <= set(names)
    assert len(set(names)) == len(names)


@pytest.mark.multiprocess
def test_documents_are_the_same_in_a_fresh_process_without_network() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    import hashlib

    assert report["count"] == len(python_docs())
    assert report["digest"] == hashlib.sha256("\x00".join(python_docs()).encode()).hexdigest()
    assert report["seconds"] < 3.0  # about 0.15 s when nothing is imported yet; generous for busy CI


def test_read_documents_yields_them_in_order() -> None:
    cfg = PythonDocsSource()
    assert tuple(cfg.documents()) == python_docs()


def test_a_loader_trains_on_them_with_the_byte_tokenizer() -> None:
    tok = ByteTokenizer.Config().build()
    cfg = TextDataLoader.Config(num_workers=0, shuffle=False, dataset=PythonDocsSource())
    loader = cfg.build(LoaderRequest(tok, 0, 1, seq_len=64, micro_batch_size=4, seed=0))
    first = next(iter(loader))
    assert first["input_ids"].shape == (4, 64)
    text = tok.decode(first["input_ids"].reshape(-1).tolist(), skip_special_tokens=True)
    assert text.startswith("abc\n\nAbstract Base Classes")
    samples = len(loader.samples)
    assert samples == (sum(len(d.encode()) + 2 for d in python_docs())) // 64
    assert [b["input_ids"].shape for b in islice(loader, 2)] == [(4, 64)] * 2
