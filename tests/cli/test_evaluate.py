"""``python -m hyper_parallel.evaluate``: a checkpoint's held-out loss is the validation training logged.

A tiny Llama 3 trains 3 steps validating at step 2 and saving a checkpoint there (one run for the module);
evaluating that checkpoint must print the tokens, loss and perplexity of the validation record of step 2.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.evaluate import evaluate, main  # noqa: E402
from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.components import write_jsonl  # noqa: E402
from tests.support.prepared import prepare, tokenizer_config  # noqa: E402
from tests.support.trainer import as_flags, debug_config_path, tiny_config, tiny_overrides  # noqa: E402

VALIDATION = {
    "validator.enable": "true",
    "validator.freq": "2",
    "validator.steps": "3",
    "validator.dataset.source": "synthetic",
    "validator.dataset.synthetic_num_samples": "64",
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Any:
    """A tiny model on a busy CPU: threads only contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The checkpoint folder of the run, and its logged validation record of step 2."""
    root = tmp_path_factory.mktemp("evaluate")
    overrides = {
        **VALIDATION,
        "training.max_steps": "3",
        "checkpoint.enable": "true",
        "checkpoint.interval": "2",
        "checkpoint.folder": str(root / "ckpt"),
        "metrics.enable_jsonl": "true",
        "metrics.jsonl_path": str(root / "metrics.jsonl"),
    }
    trainer = LLMTrainer(tiny_config("llama3", overrides))
    try:
        trainer.train()
    finally:
        trainer.close()
    records = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]
    (logged,) = [r for r in records if "validation/loss" in r]
    assert logged["step"] == 2
    return root / "ckpt", logged


def test_a_checkpoint_evaluates_to_the_validation_logged_at_its_step(
    run: tuple[Path, dict[str, Any]],
) -> None:
    folder, logged = run
    results = evaluate(tiny_config("llama3", VALIDATION), checkpoint=folder / "step-2")
    assert results["loss"] == logged["validation/loss"]
    assert results["perplexity"] == logged["validation/perplexity"]
    assert results["tokens"] == logged["validation/tokens"]
    newest = evaluate(tiny_config("llama3", VALIDATION), checkpoint=folder)  # the folder: its newest step
    assert newest["loss"] != results["loss"]  # step 3's final export: a step later


def test_the_command_line_prints_tokens_loss_and_perplexity(
    run: tuple[Path, dict[str, Any]], capsys: Any
) -> None:
    folder, logged = run
    config = str(folder / "step-2" / "config.yaml")  # the run's config, as saved beside the weights
    assert main(["--config-file", config, "--checkpoint", str(folder / "step-2"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""  # the config's training warnings are not evaluation's
    expected = {
        "tokens": int(logged["validation/tokens"]),
        "loss": logged["validation/loss"],
        "perplexity": logged["validation/perplexity"],
    }
    assert json.loads(out) == expected
    assert out.count("\n") == 1
    assert main(["--config-file", config, "--checkpoint", str(folder / "step-2")]) == 0
    line = capsys.readouterr().out
    assert line == (
        f"tokens {expected['tokens']}  loss {expected['loss']:.4f}  perplexity {expected['perplexity']:.4f}\n"
    )
    assert math.isclose(math.exp(expected["loss"]), expected["perplexity"])


def test_input_errors_exit_2_with_one_line(
    run: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: Any
) -> None:
    folder, _ = run
    config = str(folder / "step-2" / "config.yaml")
    missing = tmp_path / "nope"
    assert main(["--config-file", config, "--checkpoint", str(missing)]) == 2
    assert capsys.readouterr() == ("", f"evaluate: {str(missing)!r}: no such folder\n")
    assert main(["--config-file", config, "--dry-run"]) == 2
    assert "--dry-run is not an option of evaluate" in capsys.readouterr().err
    assert main(["--checkpoint"]) == 2
    assert "--checkpoint needs a value" in capsys.readouterr().err
    no_start = ["--checkpoint.enable", "false", "--checkpoint.initial_load_path", str(missing)]
    no_start += ["--~checkpoint.folder", "--~checkpoint.interval"]  # options of the sink turned off
    assert main(["--config-file", config, *no_start]) == 2
    assert capsys.readouterr() == (  # checked with the files, before anything is built
        "",
        f"--checkpoint.initial_load_path: {str(missing)!r} is not a directory on this machine\n"
        "1 problem found; nothing was started.\n",
    )


def test_without_config_file_the_config_saved_beside_the_checkpoint_is_read(
    run: tuple[Path, dict[str, Any]], capsys: Any
) -> None:
    folder, logged = run
    assert main(["--checkpoint", str(folder / "step-2"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert json.loads(out)["loss"] == logged["validation/loss"]
    assert main(["--checkpoint", str(folder), "--json"]) == 0  # the folder: its newest step's config
    newest = evaluate(tiny_config("llama3", VALIDATION), checkpoint=folder)
    assert json.loads(capsys.readouterr().out)["loss"] == newest["loss"]
    assert main([]) == 2
    assert capsys.readouterr().err == (
        "command line: give --config-file FILE, or --checkpoint PATH whose config.yaml is read\n"
        "1 problem found; nothing was started.\n"
    )


def test_a_vision_language_checkpoint_is_refused_in_one_line_naming_its_data(capsys: Any) -> None:
    assert main(["--config-file", str(debug_config_path("qwen3_5_vl"))]) == 2
    assert capsys.readouterr() == (
        "",
        "evaluate: 'qwen3_5_vl' is a vision-language model, trained by train_vl (its data: 'shapes', "
        "image-caption data), which evaluate cannot run yet (validation feeds the model tokens, not "
        "images): its held-out loss is not measured here\n",
    )


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_two_ranks_evaluate_to_the_same_figures(run: tuple[Path, dict[str, Any]]) -> None:
    from tests.support.processes import torchrun

    folder, logged = run
    config = str(folder / "step-2" / "config.yaml")
    flags = ["--checkpoint", str(folder / "step-2"), "--json", "--parallelism.dp_shard", "2"]
    done = torchrun(2, "-m", "hyper_parallel.evaluate", "--config-file", config, *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout)  # rank 0 alone prints, one line
    assert printed["tokens"] == int(logged["validation/tokens"])  # the set dealt over two ranks
    assert math.isclose(printed["loss"], logged["validation/loss"], rel_tol=1e-6)


def test_a_config_without_validator_data_evaluates_its_training_data_and_says_so(capsys: Any) -> None:
    # README's example: the training config alone (python_docs has no held-out split).
    debug = str(debug_config_path("llama3"))
    flags = as_flags({**tiny_overrides("llama3"), "dataloader.dataset.source": "python_docs"})
    assert main(["--config-file", debug, *flags, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == (
        "evaluate: no validator section, and the training data ('python_docs') has no held-out split "
        "(dataloader.dataset.holdout_fraction of prepared folders): evaluating the first 8 batches of the "
        "training data itself, which the model may have trained on\n"
    )
    assert json.loads(out)["tokens"] == 8 * 2 * 31  # 8 batches of micro_batch_size 2 x 32 tokens, shifted


def test_prepared_training_data_evaluates_its_held_out_split(tmp_path: Path, capsys: Any) -> None:
    corpus = write_jsonl(tmp_path / "train.jsonl", 400)
    folder = prepare([corpus], tmp_path / "prepared", tokenizer_config(tmp_path / "prep"))
    debug = str(debug_config_path("llama3"))
    data = {
        "dataloader.dataset.source": "tokenized",
        "dataloader.dataset.paths": f"[{folder}]",
        "dataloader.dataset.holdout_fraction": "0.25",
    }
    flags = as_flags({**tiny_overrides("llama3"), **data})
    assert main(["--config-file", debug, *flags, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == (
        "evaluate: no validator section: evaluating the training data's held-out split (the last 0.25 of "
        "each folder's documents)\n"
    )
    # the whole held-out split (validator.steps -1): its 100 documents' tokens, packed into samples
    ours = evaluate(
        tiny_config(
            "llama3",
            {
                **data,
                "validator.dataset.source": "tokenized",
                "validator.dataset.paths": f"[{folder}]",
                "validator.dataset.holdout_fraction": "0.25",
                "validator.dataset.split": "holdout",
            },
        ),
    )
    assert json.loads(out)["tokens"] == ours["tokens"]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_ranks_that_read_different_steps_of_a_live_folder_stop_with_one_line(
    run: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """A save and a prune between two ranks' listings of the folder: rank 1 still sees step 2 as the
    newest while rank 0 reads step 3. Every rank stops saying so (exit 2), none mixes two steps' weights."""
    from tests.support.processes import torchrun

    folder, _ = run
    script = tmp_path / "racing_evaluate.py"
    script.write_text(
        "import os, sys\n"
        "from hyper_parallel.components.checkpoint import _newest\n"
        "if os.environ['RANK'] == '1':  # this rank listed the folder before step 3 was published\n"
        "    listed = _newest.complete_steps\n"
        "    _newest.complete_steps = lambda path: [s for s in listed(path) if s != 3]\n"
        "from hyper_parallel.evaluate import main\n"
        "sys.exit(main())\n"
    )
    config = str(folder / "step-2" / "config.yaml")
    flags = ["--checkpoint", str(folder), "--json", "--parallelism.dp_shard", "2"]
    done = torchrun(2, str(script), "--config-file", config, *flags)
    assert done.returncode != 0
    assert done.stdout == ""
    assert (
        f"evaluate: checkpoint.folder {str(folder)!r}: the ranks see different newest checkpoints (rank 0: "
        "step 3, rank 1: step 2); every rank must see the same folder"
    ) in done.stderr
