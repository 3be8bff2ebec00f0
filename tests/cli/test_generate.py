"""``python -m hyper_parallel.generate``: a checkpoint and its export continue a prompt with the same text.

Tiny Llama 3, Qwen 3.5 and Qwen 3.5 MoE models train 2 steps with checkpoints on (one run per model for
the module); the command reads the checkpoint folder and the folder ``hyper_parallel.export`` wrote from it,
prints the prompt and its continuation on stdout and nothing else, and refuses bad input with one line and
exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.export import export_checkpoint  # noqa: E402
from hyper_parallel.generate import main  # noqa: E402
from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.trainer import tiny_config  # noqa: E402

PROMPT = "def add(a, b):"
#: max_seq_len of the debug flavors.
POSITIONS = {"llama3": 2048, "qwen3_5": 4096, "qwen3_5_moe": 4096}


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Any:
    """Decoding a tiny model is many small operations: threads only contend (10x slower on a busy CPU)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=list(POSITIONS))
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The checkpoint folder of a 2-step run of the tiny model, and its export."""
    root = tmp_path_factory.mktemp(request.param, numbered=False)
    overrides = {"training.max_steps": "2", "checkpoint.enable": "true"}
    overrides["checkpoint.folder"] = str(root / "ckpt")
    trainer = LLMTrainer(tiny_config(request.param, overrides))
    try:
        trainer.train()
    finally:
        trainer.close()
    return root / "ckpt", export_checkpoint(root / "ckpt", root / "hf")


def _generate(capsys: Any, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_a_checkpoint_and_its_export_continue_the_prompt_alike(run: tuple[Path, Path], capsys: Any) -> None:
    checkpoint, exported = run
    flags = ["--prompt", PROMPT, "--max-new-tokens", "24"]
    status, out, err = _generate(capsys, str(checkpoint), *flags)
    assert status == 0, err
    assert out.startswith(PROMPT)
    assert out.endswith("\n")
    assert len(out) > len(PROMPT) + 1  # some continuation (the byte tokenizer: one character per token)
    model = checkpoint.parent.name  # the fixture's folder is named by the model
    assert err == f"generate: {checkpoint / 'step-2'} ({model} debugmodel)\n"
    assert _generate(capsys, str(checkpoint / "step-2"), *flags)[1] == out  # the step folder itself
    from_export = _generate(capsys, str(exported), *flags)
    assert from_export[:2] == (0, out), from_export[2]


def test_chat_answers_the_prompt_as_a_user_turn_rendered_as_by_hand(
    run: tuple[Path, Path], capsys: Any
) -> None:
    checkpoint, exported = run
    if checkpoint.parent.name != "llama3":
        pytest.skip("the rendering is the tokenizer's, whatever the model: one model suffices")
    flags = ["--max-new-tokens", "12"]
    by_hand = "<|system|>\nBe brief.\n<|user|>\nWhat is my name?\n<|assistant|>\n"  # the built-in format
    status, out, err = _generate(capsys, str(checkpoint), "--prompt", by_hand, *flags)
    assert status == 0, err
    chat = ["--chat", "--system", "Be brief.", "--prompt", "What is my name?", *flags]
    assert _generate(capsys, str(checkpoint), *chat)[:2] == (0, out)
    assert _generate(capsys, str(exported), *chat)[:2] == (0, out)  # its tokenizer_config's chat_template
    assert _generate(capsys, str(checkpoint), "--system", "x", "--prompt", "y") == (
        2,
        "",
        "generate: --system: only read with --chat\n",
    )


def test_chat_history_puts_the_earlier_turns_before_the_prompt_as_by_hand(
    run: tuple[Path, Path], capsys: Any, tmp_path: Path
) -> None:
    checkpoint, exported = run
    if checkpoint.parent.name != "llama3":
        pytest.skip("the rendering is the tokenizer's, whatever the model: one model suffices")
    flags = ["--max-new-tokens", "8"]
    earlier = [{"from": "human", "value": "My name is Zed"}, {"from": "gpt", "value": "Hi Zed"}]
    history = tmp_path / "history.json"
    history.write_text(json.dumps({"conversations": earlier}))  # ShareGPT, as prepare reads it
    # the built-in format; the earlier answer's EOS id is left out of the text printed
    status, out, err = _generate(
        capsys, str(checkpoint), "--chat", "--history", str(history), "--prompt", "What is my name?", *flags
    )
    assert status == 0, err
    assert out.startswith(
        "<|user|>\nMy name is Zed\n<|assistant|>\nHi Zed<|user|>\nWhat is my name?\n<|assistant|>\n"
    )
    # the export renders with the chat_template its tokenizer_config.json carries: the same ids, the same text
    chat = ["--chat", "--history", str(history), "--prompt", "What is my name?", *flags]
    assert _generate(capsys, str(exported), *chat)[:2] == (0, out)
    history.write_text('{"messages": [{"role": "bot", "content": "x"}]}')
    status, _, err = _generate(capsys, str(checkpoint), "--chat", "--history", str(history), "--prompt", "y")
    assert (status, err.splitlines()[-1]) == (
        2,
        f"generate: {history}: messages[0] has role 'bot', not one of system, user, assistant, tool",
    )
    assert _generate(capsys, str(checkpoint), "--history", str(history), "--prompt", "y") == (
        2,
        "",
        "generate: --history: only read with --chat\n",
    )


def test_sampling_repeats_with_a_seed(run: tuple[Path, Path], capsys: Any) -> None:
    checkpoint, exported = run
    flags = ["--prompt", PROMPT, "--max-new-tokens", "10", "--temperature", "1.0", "--top-p", "0.9"]
    first = _generate(capsys, str(checkpoint), *flags, "--seed", "7")[1]
    assert _generate(capsys, str(exported), *flags, "--seed", "7")[1] == first
    assert _generate(capsys, str(checkpoint), *flags, "--seed", "8")[1] != first


def test_input_errors_are_one_line_and_exit_2(run: tuple[Path, Path], tmp_path: Path, capsys: Any) -> None:
    checkpoint, exported = run
    (tmp_path / "empty").mkdir()
    cases = [
        ([str(tmp_path / "nope")], f"{str(tmp_path / 'nope')!r}: no such folder"),
        (
            [str(tmp_path / "empty")],
            f"{str(tmp_path / 'empty')!r} is not a checkpoint: it holds neither a DCP '.metadata' file nor a "
            "complete step-<N> folder",
        ),
        ([str(checkpoint), "--top-p", "0"], "--top-p: must be in (0, 1], got 0.0"),
        ([str(checkpoint), "--temperature", "-1"], "--temperature: must be >= 0, got -1.0"),
        ([str(checkpoint), "--max-new-tokens", "0"], "--max-new-tokens: must be >= 1, got 0"),
        (
            [str(checkpoint), "--max-new-tokens", "100000"],
            "--max-new-tokens: the prompt's 15 tokens and 100000 new ones exceed the model's "
            f"{POSITIONS[checkpoint.parent.name]} positions",
        ),
        (
            [str(exported), "--config-file", "x.yaml"],
            f"--config-file: {str(exported)!r} is a Hugging Face folder; its config.json is read",
        ),
    ]
    for argv, message in cases:
        status, out, err = _generate(capsys, *argv, "--prompt", PROMPT)
        assert (status, out) == (2, ""), argv
        assert err.splitlines()[-1] == f"generate: {message}", argv


def test_an_unknown_model_type_in_config_json_is_an_input_error(
    run: tuple[Path, Path], tmp_path: Path, capsys: Any
) -> None:
    _, exported = run
    broken = tmp_path / "hf"
    broken.mkdir()
    for item in exported.iterdir():
        (broken / item.name).write_bytes(item.read_bytes())
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "zzz"}))
    status, out, err = _generate(capsys, str(broken), "--prompt", PROMPT)
    assert (status, out) == (2, "")
    transformers = pytest.importorskip("transformers")

    assert err == (
        f"generate: {str(broken / 'config.json')!r}: model_type 'zzz' is not a model this project builds "
        "(known: 'llama', 'qwen3_5_text', 'qwen3_5', 'qwen3_5_moe_text'), and the transformers path refuses "
        f"it: model_type 'zzz' is not a model transformers {transformers.__version__} knows\n"
    )
