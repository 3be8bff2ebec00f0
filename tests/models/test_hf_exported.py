"""An export of a transformers-path run is read back by ``generate`` and ``evaluate`` as its checkpoint is.

A tiny Mistral (``model: {_target_: hyper_parallel.models.hf.create_model_spec, path: FOLDER}``) trains 4
steps, saving at steps 2 and 4, and ``python -m hyper_parallel.export`` writes its Hugging Face folder
(one run for the module). ``generate`` of that folder builds the transformers model from its
``config.json`` (no native model has its ``model_type``) and continues a prompt with the text the
checkpoint gives, its ids those of transformers' own greedy search; ``evaluate --checkpoint FOLDER
--config-file RUN`` prints the loss of the checkpoint it was exported from, and without ``--config-file``
it is refused in one line.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hyper_parallel import evaluate, generate  # noqa: E402
from hyper_parallel.export import export_checkpoint  # noqa: E402
from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.hf_models import hf_config, write_tiny_model  # noqa: E402
from tests.support.trainer import saving_every_two_steps  # noqa: E402

pytestmark = pytest.mark.timeout(300)

PROMPT = "def f"
#: The validation data evaluate reads (the run's config names none).
VALIDATION = ["--validator.dataset.source", "python_docs", "--validator.steps", "2", "--json"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The checkpoint folder of the tiny Mistral's run, and its export."""
    root = tmp_path_factory.mktemp("hf_export")
    folder = write_tiny_model("mistral", root / "mistral")
    overrides = {"dataloader.dataset.source": "python_docs", **saving_every_two_steps(root / "ckpt")}
    trainer = LLMTrainer(hf_config(folder, overrides))
    try:
        trainer.train()
    finally:
        trainer.close()
    return root / "ckpt", export_checkpoint(root / "ckpt", root / "export")


def _generate(capsys: Any, *argv: str) -> tuple[int, str, str]:
    status = generate.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_generate_continues_from_the_export_as_from_its_checkpoint_and_as_transformers(
    run: tuple[Path, Path], capsys: Any
) -> None:
    checkpoint, exported = run
    flags = ["--prompt", PROMPT, "--max-new-tokens", "12"]
    status, out, err = _generate(capsys, str(checkpoint), *flags)
    assert status == 0, err
    assert out.startswith(PROMPT)
    assert len(out) > len(PROMPT) + 1  # some continuation
    assert _generate(capsys, str(exported), *flags) == (0, out, f"generate: {exported} (hf mistral)\n")

    loaded = generate.load_model(exported)
    prompt = loaded.tokenizer.encode(PROMPT, add_eos=False)
    from hyper_parallel.models import generate_ids

    ours = generate_ids(loaded.model, prompt, max_new_tokens=12)
    reference = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    with torch.no_grad():
        greedy = reference.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None
        )
    assert ours == greedy[0, len(prompt) :].tolist()


def _evaluate(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = evaluate.main(list(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_evaluate_gives_the_export_the_loss_of_the_checkpoint_it_came_from(run: tuple[Path, Path]) -> None:
    checkpoint, exported = run
    status, out, err = _evaluate("--checkpoint", str(checkpoint), *VALIDATION)
    assert status == 0, err
    config = checkpoint / "step-4" / "config.yaml"
    again = _evaluate("--checkpoint", str(exported), "--config-file", str(config), *VALIDATION)
    assert again[:2] == (0, out), again[2]
    assert json.loads(out)["tokens"] > 0


def test_evaluate_of_an_export_without_a_config_is_refused_in_one_line(run: tuple[Path, Path]) -> None:
    _, exported = run
    assert _evaluate("--checkpoint", str(exported)) == (
        2,
        "",
        f"--checkpoint: {str(exported)!r} is a Hugging Face folder (an export), which holds no run config: "
        "give --config-file FILE (the run's config.yaml: its validation data and tokenizer)\n"
        "1 problem found; nothing was started.\n",
    )
