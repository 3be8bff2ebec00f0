"""Every input error in the first report: a user never fixes one round of errors to be shown the next.

Each test holds one error of each kind that used to wait for a later run: values inside a group whose
``_target_`` is wrong (checked against the target it most likely meant), command-line flags, the rules that
span groups when another group is refused, and the warnings.
"""

import io
from pathlib import Path

from hyper_parallel.launch import main

MODEL = """\
model:
  _target_: hyper_parallel.models.llama3.create_model_spec
  flavor: debugmodel
tokenizer:
  _target_: hyper_parallel.components.tokenizer.ByteTokenizer.Config
"""
#: Training data, named (a run without it is refused); added after the groups each test writes.
DATA = """dataloader:
  _target_: hyper_parallel.components.dataloader.TextDataLoader.Config
  dataset:
    source: python_docs
"""
#: What a tp of 3 on the llama3 debug model is told (8 heads, 4 key/value heads), world size or not.
HEADS = "must divide the model's 8 attention heads and 4 key/value heads, got 3"


def run(path: Path, *flags: str) -> tuple[int, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--config-file", str(path), "--dry-run", *flags], out=out, err=err)
    return code, err.getvalue().splitlines()


def test_values_under_a_wrong_target_and_flags_are_in_the_first_report(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    model = "model:\n  _target_: hyper_parallel.models.llama3.create_model_spec\n  flavour: debugmodel\n"
    path.write_text(
        model
        + "  overrides:\n    vocab_size: '512'\n"
        + "tokenizer:\n  _target_: hyper_parallel.components.tokenizer.ByteTokenizer.Config\n"
        + "training:\n  _target_: hyper_parallel.trainer.config.TraningConfig\n  max_steps: 100.0\n"
        + "optimizer:\n  _target_: hyper_parallel.components.optimizer.AdamW\n  lrr: 0.1\n"
    )
    code, lines = run(path, "--training.seq_len", "x", "--optimizr.lr", "3")
    assert code == 2
    assert lines == [
        f"{path}:3:3: model.flavour: unknown parameter 'flavour' of create_model_spec(); "
        "did you mean 'flavor'?",
        f"{path}:5:17: model.overrides.vocab_size: expected an integer, got the string '512'",
        f"{path}:9:13: training._target_: module 'hyper_parallel.trainer.config' has no attribute "
        "'TraningConfig'; did you mean 'TrainingConfig'?",
        f"{path}:10:14: training.max_steps: expected an integer, got the number 100.0",
        f"{path}:12:13: optimizer._target_: 'hyper_parallel.components.optimizer.AdamW' is the class AdamW; "
        "did you mean 'hyper_parallel.components.optimizer.AdamW.Config'?",
        f"{path}:13:3: optimizer.lrr: unknown field 'lrr' for AdamW.Config; did you mean 'lr'?",
        "--optimizr.lr: optimizr: unknown root field 'optimizr'; did you mean 'optimizer'?",
        "--training.seq_len: expected an integer, got the string 'x'",
        "not checked: the rules that span groups and the files the config names (no config could be made "
        "while these errors stand)",
        "8 problems found; nothing was started.",
    ]


def test_a_group_refused_by_its_own_check_hides_no_rule_that_spans_groups(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    validator = "hyper_parallel.components.validator.LossValidator.Config"
    data = "  dataset:\n    source: python_docs\n"
    path.write_text(f"{MODEL}validator:\n  _target_: {validator}\n  enable: true\n  freq: 500\n{data}{DATA}")
    flags = ["--training.global_batch_size", "7", "--training.micro_batch_size", "4"]
    code, lines = run(path, *flags, "--training.max_steps", "10", "--parallelism.tp", "3")
    assert code == 2
    assert lines == [
        f"{path}:9:9: warning: validator.freq: validation would never run: freq (500) exceeds "
        "training.max_steps (10, set by --training.max_steps)",
        "1 warning (--strict refuses them)",
        f"{path}:1:1: training.seq_len: must be divisible by parallelism.tp (3, set by --parallelism.tp) "
        "for sequence parallelism (each tp rank holds an equal slice of the sequence; or set "
        "parallelism.sequence_parallel to false), got 2048",
        f"--parallelism.tp: {HEADS}",
        "--training.global_batch_size: must be a multiple of micro_batch_size (4, set by "
        "--training.micro_batch_size), got 7",
        "3 problems found; nothing was started.",
    ]


def test_the_rules_do_not_speak_of_a_group_that_could_not_be_made(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        MODEL
        + "training:\n  _target_: hyper_parallel.trainer.config.TrainingConfig\n  seq_len: 256\n"
        + "parallelism:\n  _target_: hyper_parallel.trainer.config.ParallelismConfig\n  tp: 3\n"
        + "optimizer:\n  _target_: hyper_parallel.components.optimizer.AdamW.Config\n  lr: x\n"
        + DATA
    )
    code, lines = run(path)
    assert code == 2
    assert lines == [
        f"{path}:8:12: training.seq_len: must be divisible by parallelism.tp (3) for sequence parallelism "
        "(each tp rank holds an equal slice of the sequence; or set parallelism.sequence_parallel to false), "
        "got 256",
        f"{path}:11:7: parallelism.tp: {HEADS}",
        f"{path}:14:7: optimizer.lr: expected a number, got the string 'x'",
        "3 problems found; nothing was started.",
    ]


def test_the_rules_see_the_flags_values_while_the_file_has_an_error(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        MODEL
        + "parallelism:\n  _target_: hyper_parallel.trainer.config.ParallelismConfig\n  tp: 3\n"
        + "optimizer:\n  _target_: hyper_parallel.components.optimizer.AdamW.Config\n  lr: x\n"
        + DATA
    )
    code, lines = run(path, "--training.seq_len", "256", "--training.max_steps", "500")
    assert code == 2
    assert lines == [
        f"{path}:8:7: parallelism.tp: {HEADS}",
        f"{path}:11:7: optimizer.lr: expected a number, got the string 'x'",
        "--training.seq_len: must be divisible by parallelism.tp (3) for sequence parallelism (each tp rank "
        "holds an equal slice of the sequence; or set parallelism.sequence_parallel to false), got 256",
        "3 problems found; nothing was started.",
    ]
