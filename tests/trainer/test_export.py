"""``hyper_parallel.export``: checkpoints become Hugging Face folders that transformers loads to our logits.

Tiny Llama 3 and Qwen 3.5 models train for 2 steps on the CPU with checkpoints on; the exported folder is
loaded with ``AutoModelForCausalLM.from_pretrained`` and must give the trained model's logits (fp32, 1e-4),
whether the checkpoint is the final weights-only export or a full one, one file or shards with an index,
saved by one process or by FSDP2 or tensor parallelism on two.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from hyper_parallel.export import ExportError, export_checkpoint, main, parse_size  # noqa: E402
from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.processes import clean_env  # noqa: E402
from tests.support.trainer import ROOT, tiny_config, train_runs_under_torchrun  # noqa: E402

RUN = {"training.max_steps": "2", "checkpoint.enable": "true"}


def _train(model: str, folder: Path, **overrides: str) -> Any:
    """Train the tiny ``model`` for 2 steps with checkpoints in ``folder``; the trained module (eval)."""
    trainer = LLMTrainer(tiny_config(model, {**RUN, "checkpoint.folder": str(folder), **overrides}))
    try:
        trainer.train()
        return trainer.model.eval()
    finally:
        trainer.close()


def _tokens() -> Any:
    return torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))


def _logits_gap(ours: Any, folder: Path) -> float:
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = _tokens()
    with torch.no_grad():
        return float((ours(ids) - hf(ids).logits).abs().max())


#: What an export of a one-file model writes: the weights, their config, the tokenizer's files.
FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
]

KINDS = {
    "final-export": {},  # last_save_model_only (the default): the final save holds the weights only
    "full": {"checkpoint.last_save_model_only": "false"},
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("model", ["llama3", "qwen3_5"])
def test_an_export_loads_in_transformers_with_the_trained_logits(
    model: str, kind: str, tmp_path: Path
) -> None:
    ours = _train(model, tmp_path / "ckpt", **KINDS[kind])
    step = tmp_path / "ckpt" / "step-2"
    assert (step / "config.yaml").is_file()  # the resolved config saved beside the weights
    out = export_checkpoint(tmp_path / "ckpt", tmp_path / "hf")  # the folder: its newest step
    assert sorted(p.name for p in out.iterdir()) == FILES
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "float32"
    assert _logits_gap(ours, out) <= 1e-4


def test_tied_embeddings_are_written_once_and_tied_on_load(tmp_path: Path) -> None:
    ours = _train("qwen3_5", tmp_path / "ckpt", **{"model.overrides.tie_word_embeddings": "true"})
    out = export_checkpoint(tmp_path / "ckpt" / "step-2", tmp_path / "hf")
    assert "lm_head.weight" not in safetensors_torch.load_file(str(out / "model.safetensors"))
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    assert _logits_gap(ours, out) <= 1e-4


def test_above_the_max_shard_size_the_weights_are_sharded_with_an_index(tmp_path: Path) -> None:
    ours = _train("llama3", tmp_path / "ckpt")
    out = export_checkpoint(tmp_path / "ckpt", tmp_path / "hf", max_shard_size="100KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) > 2
    assert files == [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
    shards = {name: safetensors_torch.load_file(str(out / name)) for name in files}
    assert sorted(index["weight_map"].values()) == sorted(n for n, s in shards.items() for _ in s)
    for name, tensors in shards.items():
        sizes = [t.numel() * t.element_size() for t in tensors.values()]
        assert sum(sizes) <= 100_000 or len(sizes) == 1, name  # only a tensor above the limit is alone
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for s in shards.values() for t in s.values()
    )
    assert _logits_gap(ours, out) <= 1e-4


def _dtypes(folder: Path) -> set[Any]:
    return {t.dtype for t in safetensors_torch.load_file(str(folder / "model.safetensors")).values()}


def test_export_dtype_bfloat16_writes_bfloat16_weights(tmp_path: Path) -> None:
    ours = _train("llama3", tmp_path / "ckpt", **{"checkpoint.export_dtype": "bfloat16"})
    out = export_checkpoint(tmp_path / "ckpt", tmp_path / "hf")  # kept as the final export saved them
    assert _dtypes(out) == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert hf.dtype == torch.bfloat16
    assert torch.equal(hf.model.embed_tokens.weight, ours.tok_embeddings.weight.to(torch.bfloat16))
    back = export_checkpoint(tmp_path / "ckpt", tmp_path / "fp32", dtype="float32")
    assert _dtypes(back) == {torch.float32}


def test_dtype_casts_a_float32_checkpoint(tmp_path: Path) -> None:
    _train("qwen3_5", tmp_path / "ckpt")
    out = export_checkpoint(tmp_path / "ckpt", tmp_path / "hf", dtype="float16")
    assert _dtypes(out) == {torch.float16}
    assert transformers.AutoModelForCausalLM.from_pretrained(out).dtype == torch.float16


TWO_PROCESS_LAYOUTS = {
    "dp_shard2": {"parallelism.dp_shard": "2"},
    "tp2": {"parallelism.dp_shard": "1", "parallelism.tp": "2"},
}


@pytest.fixture(scope="module")
def saved_by_two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Checkpoints of both two-process layouts (``<layout>/ckpt``), trained in one torchrun job."""
    tmp = tmp_path_factory.mktemp("two-processes")
    runs = {
        name: ("llama3", {**RUN, "checkpoint.folder": str(tmp / name / "ckpt"), **layout})
        for name, layout in TWO_PROCESS_LAYOUTS.items()
    }
    train_runs_under_torchrun(2, tmp, runs)
    return tmp


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", list(TWO_PROCESS_LAYOUTS))
def test_a_checkpoint_saved_by_two_processes_exports(layout: str, saved_by_two: Path, tmp_path: Path) -> None:
    ours = _train("llama3", tmp_path / "one")  # one process trains the same weights (same losses, 1e-5)
    out = export_checkpoint(saved_by_two / layout / "ckpt", tmp_path / "hf")
    assert _logits_gap(ours, out) <= 1e-4


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("trained") / "ckpt"
    _train("llama3", folder)
    return folder


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_the_command_line_exports_and_says_where(trained: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hyper_parallel.export",
            str(trained),
            str(tmp_path / "hf"),
            "--dtype",
            "bfloat16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"exported {trained} to {tmp_path / 'hf'}: {', '.join(FILES)}\n"
    assert _dtypes(tmp_path / "hf") == {torch.bfloat16}


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_the_command_line_refuses_a_missing_folder_with_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    done = subprocess.run(
        [sys.executable, "-m", "hyper_parallel.export", str(missing), str(tmp_path / "hf")],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
        cwd=ROOT,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"export: {str(missing)!r}: no such folder\n"


def _errors(trained: Path, tmp_path: Path) -> list[tuple[list[str], str]]:
    (tmp_path / "empty").mkdir()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    no_config = tmp_path / "old" / "step-2"
    no_config.mkdir(parents=True)
    for item in (trained / "step-2").iterdir():
        if item.name != "config.yaml":
            (no_config / item.name).write_bytes(item.read_bytes())
    out = str(tmp_path / "hf")
    return [
        (
            [str(tmp_path / "empty"), out],
            f"{str(tmp_path / 'empty')!r} is not a checkpoint: it holds neither a DCP '.metadata' file nor a "
            "complete step-<N> folder",
        ),
        (
            [str(trained), out, "--dtype", "float8"],
            "dtype: unknown dtype 'float8'; choose one of float32, bfloat16, float16",
        ),
        (
            [str(trained), out, "--max-shard-size", "5 parsecs"],
            "max_shard_size: cannot read '5 parsecs' as a size; write bytes or a number with a unit (KB, MB, "
            "GB, TB, KiB, MiB, GiB, TiB), e.g. '5GB'",
        ),
        (
            [str(trained), str(tmp_path / "taken")],
            f"{str(tmp_path / 'taken')!r} exists and is not an empty folder; choose a new output folder",
        ),
        (
            [str(no_config), out],
            f"{str(no_config)!r} holds no config.yaml (saved by an older version): pass the run's config "
            "with --config-file (config= in Python)",
        ),
        (
            [str(no_config), out, "--config-file", str(tmp_path / "none.yaml")],
            f"config file {str(tmp_path / 'none.yaml')!r} does not exist",
        ),
    ]


def test_input_errors_are_one_line_and_exit_2(trained: Path, tmp_path: Path, capsys: Any) -> None:
    for argv, message in _errors(trained, tmp_path):
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        assert (captured.out, captured.err) == ("", f"export: {message}\n"), argv
    assert not (tmp_path / "hf").exists()


def test_an_old_checkpoint_exports_with_the_config_given(trained: Path, tmp_path: Path) -> None:
    config = tiny_config("llama3", RUN)
    out = export_checkpoint(trained / "step-2", tmp_path / "hf", config=config)
    assert (out / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("size", "expected"),
    [(123, 123), ("5GB", 5 * 10**9), ("1.5 MiB", 3 * 2**19), ("100", 100), ("2kb", 2000)],
)
def test_sizes_read_like_hugging_face_sizes(size: Any, expected: int) -> None:
    assert parse_size(size) == expected


def test_a_zero_size_is_refused() -> None:
    with pytest.raises(ExportError, match=r"max_shard_size: must be at least 1 byte, got '0KB'"):
        parse_size("0KB")


def test_an_output_that_is_a_symlink_is_refused_before_anything_is_written(
    trained: Path, tmp_path: Path, capsys: Any
) -> None:
    target = tmp_path / "target"
    target.mkdir()  # empty: following the link would pass the emptiness check and write there
    (tmp_path / "hf").symlink_to(target)
    assert main([str(trained), str(tmp_path / "hf")]) == 2
    assert capsys.readouterr().err == (
        f"export: {str(tmp_path / 'hf')!r} is a symbolic link; the export never writes through one: remove "
        "it or choose a new output folder\n"
    )
    assert list(target.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "target"]


def test_a_planted_partial_symlink_of_the_output_is_refused_and_its_target_untouched(
    trained: Path, tmp_path: Path, capsys: Any
) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}\n")
    (tmp_path / ".hf.partial").symlink_to(target)
    assert main([str(trained), str(tmp_path / "hf")]) == 2
    assert f"{str(tmp_path / '.hf.partial')!r} is a symbolic link" in capsys.readouterr().err
    assert sorted(p.name for p in target.iterdir()) == ["config.json"]
    assert (target / "config.json").read_text() == "{}\n"
    assert not (tmp_path / "hf").exists()


def test_a_non_empty_output_folder_is_refused_and_left_as_it_was(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text("theirs\n")
    with pytest.raises(ExportError, match="exists and is not an empty folder"):
        export_checkpoint(trained, out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]
    assert (out / "config.json").read_text() == "theirs\n"
    assert not (tmp_path / ".hf.partial").exists()


def _umask(mask: int) -> int:
    import os

    return os.umask(mask)


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_every_exported_file_has_the_mode_the_umask_gives(mask: int, trained: Path, tmp_path: Path) -> None:
    previous = _umask(mask)
    try:
        out = export_checkpoint(trained, tmp_path / "hf")
    finally:
        _umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes == dict.fromkeys(FILES, 0o666 & ~mask)  # model.safetensors was 0600 whatever the umask


def _utf8_text_with_every_byte() -> str:
    """Characters whose UTF-8 encodings hold every byte valid UTF-8 can hold (all but C0, C1, F5-FF)."""
    chars = [chr(c) for c in range(0x800)]  # 00-7F, then leads C2-DF with every continuation 80-BF
    chars += [chr(c) for c in (0x800, *range(0x1000, 0x10000, 0x1000))]  # leads E0-EF (ED: U+D000)
    chars += [chr(c) for c in (0x10000, 0x40000, 0x80000, 0xC0000, 0x100000)]  # leads F0-F4
    return "".join(chars)


def test_the_byte_tokenizer_exports_as_an_equivalent_tokenizer_json(trained: Path, tmp_path: Path) -> None:
    from hyper_parallel.components.tokenizer import ByteTokenizer, HuggingFaceTokenizer

    out = export_checkpoint(trained, tmp_path / "hf")
    ours = ByteTokenizer.Config().build()
    theirs = HuggingFaceTokenizer.Config(path=str(out)).build()  # what generate reads from the folder
    auto = transformers.AutoTokenizer.from_pretrained(out)
    text = _utf8_text_with_every_byte()
    covered = set(text.encode("utf-8"))
    assert covered == set(range(256)) - {0xC0, 0xC1, *range(0xF5, 0x100)}
    for sample in (text, "", "  two  spaces\n\ttab"):
        assert theirs.encode(sample) == ours.encode(sample), sample
        expected = ours.encode(sample, add_eos=False)
        assert auto(sample)["input_ids"] == expected, sample  # BOS added, EOS not: a prompt
        assert auto.decode(expected) == ours.decode(expected)
    # Written in a text, the special tokens are the special ids, as a chat template writes them (and as
    # the byte tokenizer reads a rendered template: encode_with_offsets), not their bytes.
    sample = "<s> and </s> and <pad> are specials here"
    ((rendered, _),) = ours.encode_with_offsets([sample])
    assert rendered[:3] == [256, *b" a"]
    assert {257, 258} <= set(rendered)
    assert auto(sample)["input_ids"] == [256, *rendered]
    assert theirs.encode(sample, add_eos=False) == [256, *rendered]
    specials = {"<s>": 256, "</s>": 257, "<pad>": 258}
    assert {t: auto.convert_tokens_to_ids(t) for t in specials} == specials
    assert (auto.bos_token, auto.eos_token, auto.pad_token) == ("<s>", "</s>", "<pad>")
    assert (theirs.bos_id, theirs.eos_id, theirs.pad_id, theirs.vocab_size) == (256, 257, 258, 259)
    every_id = list(range(259))
    for ids in ([[i] for i in every_id], [every_id, every_id[::-1], [0xE6, 0x97, 0xA5, 0x80, 0xFF, 256]]):
        for sequence in ids:
            assert theirs.decode(sequence) == ours.decode(sequence), sequence
            assert auto.decode(sequence) == ours.decode(sequence), sequence


def _user_tokenizer(folder: Path, post: str) -> Path:
    """A user's ``tokenizer.json``: word-level, whose post-processor adds nothing, or BOS and EOS."""
    from tokenizers import processors

    from tests.support.components import train_tokenizer

    train_tokenizer(folder)
    if post == "bos-and-eos":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        specials = [("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))]
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> $B", special_tokens=specials
        )
        tok.save(str(folder / "tokenizer.json"))
    return folder


#: A corpus of the user tokenizer's words (and one unknown), each text encoded both ways.
CORPUS = ["the lazy dog", "quick fox", "", "dog dog the", "unknownword the", "fox\n\tlazy"]


@pytest.mark.parametrize("add_bos", [True, False])
@pytest.mark.parametrize("post", ["none", "bos-and-eos"])
def test_the_exported_user_tokenizer_gives_the_ids_training_gave(
    post: str, add_bos: bool, trained: Path, tmp_path: Path
) -> None:
    import attrs

    from hyper_parallel.components.tokenizer import HuggingFaceTokenizer
    from hyper_parallel.config import load_config

    user = _user_tokenizer(tmp_path / "tok", post)
    tokenizer = HuggingFaceTokenizer.Config(path=str(user), add_bos=add_bos)
    cfg = attrs.evolve(load_config(trained / "step-2" / "config.yaml"), tokenizer=tokenizer)
    out = export_checkpoint(trained, tmp_path / "hf", config=cfg)
    ours = tokenizer.build()
    auto = transformers.AutoTokenizer.from_pretrained(out)
    for text in CORPUS:  # what training encoded in front of a document, and never an EOS: a prompt
        assert auto(text)["input_ids"] == ours.encode(text, add_eos=False), text
    config = json.loads((out / "config.json").read_text())
    ids = {"bos_token_id": ours.bos_id, "eos_token_id": ours.eos_id, "pad_token_id": ours.pad_id}
    assert (
        {key: config[key] for key in ids} == ids == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
    )
    generation = json.loads((out / "generation_config.json").read_text())
    assert {key: generation[key] for key in ids} == ids


def test_transformers_generate_stops_at_the_exported_eos(trained: Path, tmp_path: Path) -> None:
    out = export_checkpoint(trained, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert (hf.generation_config.eos_token_id, hf.generation_config.pad_token_id) == (257, 258)

    class EosAtThird(transformers.LogitsProcessor):  # the model emits EOS as its third new token
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            if input_ids.shape[1] == prompt.shape[1] + 2:
                scores[:, :] = -float("inf")
                scores[:, 257] = 0.0
            return scores

    prompt = transformers.AutoTokenizer.from_pretrained(out)("hello", return_tensors="pt")["input_ids"]
    assert prompt[0].tolist() == [256, *b"hello"]
    with torch.no_grad():
        generated = hf.generate(prompt, max_new_tokens=10, do_sample=False, logits_processor=[EosAtThird()])
    assert generated.shape[1] == prompt.shape[1] + 3  # stopped at EOS, not at max_new_tokens
    assert generated[0, -1].item() == 257
