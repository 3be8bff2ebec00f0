"""``python -m bench gpu``: its CPU smoke mode runs every measurement path; without a GPU it says so."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch.distributed as dist  # noqa: E402

from bench.gpu import main  # noqa: E402
from bench.gpu_check import TINY_PACKED_SEQ_LEN  # noqa: E402
from bench.packed_text import chosen_files  # noqa: E402


def test_the_tiny_mode_measures_every_row_on_the_cpu_and_writes_json(tmp_path: Path, capsys: Any) -> None:
    threads = torch.get_num_threads()
    out = tmp_path / "gpu.json"
    assert main(["--tiny", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    rows = [(r["model"], r["implementation"], r["gdn"], r["loss"]) for r in results["rows"]]
    assert rows == [
        ("llama3 tiny", "ours", "-", "whole"),
        ("llama3 tiny", "ours", "-", "fused"),
        ("llama3 tiny", "transformers", "-", "whole"),
        ("qwen3.5 tiny", "ours", "chunked", "whole"),
        ("qwen3.5 tiny", "ours", "chunked", "fused"),
        ("qwen3.5 tiny", "transformers", "chunked", "whole"),
    ]
    for row in results["rows"]:
        assert row["tokens_per_second"] > 0
        assert row["tflops"] > 0  # from the preflight's FLOPs per token
        assert row["mfu"] is None  # a CPU has no peak in the table
        assert row["preflight_memory_gib"] > 0
    (kernel,) = results["kernels"]
    assert kernel["chunked_ms"] > 0
    assert kernel["fla_ms"] is None
    printed = capsys.readouterr().out
    assert printed.startswith("| model ")
    assert f"wrote {out}" in printed
    assert not dist.is_initialized()  # its one-rank process group is gone
    assert torch.get_num_threads() == threads


def test_without_a_gpu_it_skips_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--json", str(tmp_path / "gpu.json")]) == 0
    assert capsys.readouterr().out == (
        "bench gpu: skipped, no CUDA device here (python -m bench gpu --tiny runs the CPU smoke mode)\n"
    )
    assert not (tmp_path / "gpu.json").exists()


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_the_check_runs_every_step_in_its_tiny_cpu_mode(tmp_path: Path, capsys: Any) -> None:
    assert main(["--check", "--tiny", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "check.json").read_text())
    assert results["tiny"] is True
    rows = {(r["step"], r["config"], r.get("compiled", False)): r for r in results["rows"]}
    assert list(rows) == [
        ("tests", "-m cuda", False),
        ("debug", "llama3_debug", False),
        ("attention", "tiny", False),
        ("fla", "tiny", False),
        ("speed", "llama3_2_1b_gpu", False),
        ("speed", "qwen3_5_0_8b_gpu", False),
        ("speed", "llama3_2_1b_gpu packed", False),
        ("speed", "qwen3_5_0_8b_gpu packed", False),
        ("peers", "ours", False),
        ("peers", "ours_hf", False),
        ("peers", "hf_loop", False),
        ("peers", "transformers", False),
        ("peers", "liger", False),
        ("peers", "torchtitan", False),
        ("finetune", "llama3_2_1b_gpu full", False),
        ("finetune", "llama3_2_1b_gpu lora", False),
        ("finetune", "qwen3_5_debug qlora", False),
    ]
    assert all(r["ok"] for r in rows.values()), [r["notes"] for r in rows.values()]
    debug = rows[("debug", "llama3_debug", False)]
    assert debug["resumed_at"] == [2]  # the relaunch resumed the step the first run saved last
    assert debug["bf16_vs_fp32_early_max_rel"] <= debug["bf16_vs_fp32_max_rel"] <= 0.03
    assert "\ndef " in debug["generated"]  # the prompt and its continuation, after the banner
    for config in ("llama3_2_1b_gpu", "qwen3_5_0_8b_gpu"):
        speed = rows[("speed", config, False)]
        assert speed["tokens_per_second"] > 0
        assert speed["preflight_memory_gib"] > 0
    # Real text, packed: each chosen file one prepared document, rows of several (the trainer's records).
    files = chosen_files(TINY_PACKED_SEQ_LEN)
    manifest = json.loads((tmp_path / "packed-text" / "manifest.json").read_text())
    assert manifest["documents"] == len(files) > 1
    assert [i["name"] for i in manifest["inputs"]] == [str(f) for f in files]
    for config in ("llama3_2_1b_gpu", "qwen3_5_0_8b_gpu"):
        packed = rows[("speed", f"{config} packed", False)]
        assert packed["data"]["kind"] == "python stdlib source files"
        assert packed["data"]["files"] == packed["data"]["documents"] == len(files)
        assert packed["data"]["mean_tokens"] == manifest["tokens"] / len(files)
        records = [json.loads(line) for line in (tmp_path / f"{config}-packed-eager.jsonl").open()]
        logged = [r["documents_per_row"] for r in records]  # every logged step of a masked run has it
        assert packed["documents_per_row"] == sum(logged) / len(logged) > 1
        assert list(records[-1]["data_tokens"]) == [str(tmp_path / "packed-text")]  # it read the folder
        assert packed["tokens_per_second"] > 0
        assert packed["notes"][0].endswith(f"{packed['documents_per_row']:.2f} documents/row")
    lora = rows[("finetune", "llama3_2_1b_gpu lora", False)]
    full = rows[("finetune", "llama3_2_1b_gpu full", False)]
    assert lora["step_vs_full"] == full["tokens_per_second"] / lora["tokens_per_second"]
    assert rows[("finetune", "qwen3_5_debug qlora", False)]["preflight_memory_gib"] > 0
    attention = rows[("attention", "tiny", False)]
    assert attention["causal_ms"] > 0
    assert attention["two_documents_vs_causal"] == attention["two_documents_ms"] / attention["causal_ms"]
    assert attention["worst_vs_causal"] >= attention["packed_vs_causal"]
    # the CPU's layouts: none for one document a row, the dense mask for these short rows
    assert (attention["one_document_layout"], attention["two_documents_layout"]) == ("NoneType", "Tensor")
    # One harness: ours and each peer train the same tokens a step on the same (tied) parameter count.
    ours = rows[("peers", "ours", False)]
    assert (ours["tokens_per_step"], ours["parameters"], ours["steps"]) == (2 * 64, 155_968, 10)
    assert len(ours["seconds"]) == 10
    assert ours["min_s"] <= ours["median_s"] <= ours["max_s"]
    assert rows[("peers", "liger", False)]["notes"][0].startswith("skipped: ")  # Triton kernels: CUDA only
    # The transformers path through our trainer against a bare loop over the same folder's model, and the
    # native model against it (issue 45 item 7): the same tokens a step, the same (tied) parameter count.
    hf, loop = rows[("peers", "ours_hf", False)], rows[("peers", "hf_loop", False)]
    for row in (hf, loop):
        assert (row["tokens_per_step"], row["parameters"], row["steps"]) == (2 * 64, 155_968, 10)
        assert math.isfinite(row["tokens_per_second"])
        assert row["tokens_per_second"] > 0
    assert hf["trainer_vs_bare_loop"] == hf["tokens_per_second"] / loop["tokens_per_second"]
    assert hf["native_vs_hf_path"] == ours["tokens_per_second"] / hf["tokens_per_second"]
    verdicts = [note.split(": ")[1].split(" (")[0] for note in hf["notes"][-2:]]
    assert verdicts == [
        "PASS" if hf["trainer_vs_bare_loop_ok"] else "FAIL",
        "PASS" if hf["native_vs_hf_path_ok"] else "FAIL",
    ]
    assert hf["notes"][-2].startswith(f"trainer / bare loop {hf['trainer_vs_bare_loop']:.3f}x: ")
    assert hf["notes"][-2].endswith("(>= 0.97x) (not held in the tiny mode)")
    assert hf["notes"][-1].startswith(f"native / hf path {hf['native_vs_hf_path']:.3f}x: ")
    assert hf["notes"][-1].endswith("(> 1.0x) (not held in the tiny mode)")
    peers = ["transformers"]
    if importlib.util.find_spec("torchtitan") is not None:  # CI installs bench/peers/requirements.txt
        peers.append("torchtitan")
    else:
        assert rows[("peers", "torchtitan", False)]["notes"][0].startswith("skipped: torchtitan is not")
    for peer in peers:
        row = rows[("peers", peer, False)]
        assert math.isfinite(row["tokens_per_second"])
        assert row["tokens_per_second"] > 0
        assert (row["tokens_per_step"], row["parameters"]) == (ours["tokens_per_step"], ours["parameters"])
    fla = rows[("fla", "tiny", False)]  # the CPU compares our chunked kernel with the token loop
    assert fla["kernel"] == "none"
    assert fla["one_document_problem"] is None
    assert fla["two_documents_problem"] is None
    assert set(fla["one_document_errors"]) == {"output", "query", "key", "value", "log_decay", "beta"}
    assert "17/17 passed" in capsys.readouterr().out


def test_the_packed_rows_read_the_librarys_utf8_files_of_a_sixteenth_to_a_whole_row(tmp_path: Path) -> None:
    """``chosen_files``: sorted by path, sizes within [seq_len // 16, seq_len] bytes, no test folders, no
    third-party packages, nothing prepare would refuse."""
    files = {
        "b.py": 256,
        "a/z.py": 16,  # the bounds are inclusive
        "a/tiny.py": 15,
        "big.py": 257,
        "notes.txt": 32,  # not a source file
        "test/t.py": 32,
        "json/tests/t.py": 32,
        "site-packages/p.py": 32,
    }
    for name, size in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * size)
    (tmp_path / "latin.py").write_bytes(b"# caf\xe9" + b"x" * 30)
    assert chosen_files(256, tmp_path) == [tmp_path / "a" / "z.py", tmp_path / "b.py"]


def test_the_checks_budget_cuts_every_step_and_reports_what_it_skipped(tmp_path: Path) -> None:
    """A check whose budget is spent starts nothing more: each later step is a failed row saying so."""
    from bench import gpu_check

    assert gpu_check.check(True, tmp_path, budget=0.0) == 1
    results = json.loads((tmp_path / "check.json").read_text())
    assert [(r["step"], r["ok"]) for r in results["rows"]] == [
        ("tests", False),
        ("debug", False),
        ("attention", False),
        ("fla", False),
        ("speed", False),
        ("speed", False),
        ("speed", False),
        ("speed", False),
        ("peers", False),
        ("peers", False),
        ("peers", False),
        ("peers", False),
        ("peers", False),
        ("peers", False),
        ("finetune", False),
        ("finetune", False),
        ("finetune", False),
    ]
    assert (tmp_path / "tests.log").read_text() == "skipped: the check's time budget was spent\n"
    assert results["rows"][2]["notes"] == ["exited 124 (see attention.log)"]
    assert results["rows"][6]["notes"] == ["prepare exited 124 (see packed-text.log)"]


def test_the_attention_probe_says_it_needs_cuda_and_exits_cleanly(capsys: Any) -> None:
    import torch

    from bench import attention_probe

    if torch.cuda.is_available():
        pytest.skip("runs on CUDA: bench gpu --check covers the kernels it compares")
    assert attention_probe.main([]) == 0
    assert capsys.readouterr().out == (
        "bench.attention_probe: skipped, no CUDA device here (the kernels it compares are CUDA's)\n"
    )
