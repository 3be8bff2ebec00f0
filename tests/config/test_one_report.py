"""Every input error in the first report: a user never fixes one round of errors to be shown the next.

Each test holds one error of each kind that used to wait for a later run: values inside a group whose
``_target_`` is wrong (checked against the target it most likely meant), command-line flags, the rules that
span groups when another group is refused, and the warnings.
"""

import io
from pathlib import Path

import pytest

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


#: One error of each kind a file can hold, each where a line of the report says (see EACH_KIND).
EACH_KIND_FILE = """\
model:
  _target_: hyper_parallel.models.qwen3_5.create_model_spec
  flavor: debugmodel
tokenizer:
  _target_: hyper_parallel.components.tokenizer.ByteTokenizer.Config
  add_eos: false
training:
  _target_: hyper_parallel.trainer.config.TrainingConfig
  global_batch_size: 5
  micro_batch_size: 1
optimizer:
  _target_: hyper_parallel.components.optimizer.AdamW.Config
  lr: -1.0
  betaz: [0.9, 0.95]
parallelism:
  _target_: hyper_parallel.trainer.config.ParallelismConfig
  tp: 3
  dp_shard: 2
lr_scheduler:
  _target_: hyper_parallel.components.lr_scheduler.WarmupCosine.Config
metrics:
  _target_: hyper_parallel.components.metrics.MetricsLogger.Config
  log_freq: ten
checkpoint:
  _target_: hyper_parallel.components.checkpoint.DCPCheckpoint.Config
  folder: ${env:HP_TEST_ONE_REPORT_UNSET}
  folder: twice
debug:
  _target_: hyper_parallel.trainer.config.DebugConfig
  deterministic_warn_only: true
dataloader:
  _target_: hyper_parallel.components.dataloader.TextDataLoader.Config
  dataset:
    source: jsonl
    paths: [DATA]
"""
#: The bad flags given with it: a model argument, a value of the wrong type, a group that does not exist.
EACH_KIND_FLAGS = (
    "--model.overrides.n_layer",
    "2",
    "--optimizer.weight_decay",
    "x",
    "--trainin.max_steps",
    "5",
)
SEQ_3 = (
    "must be divisible by parallelism.tp (3) for sequence parallelism (each tp rank holds an equal slice "
    "of the sequence; or set parallelism.sequence_parallel to false), got 2048"
)
#: What the stated degrees tp 3 and dp_shard 2 are told on 2 ranks.
RANKS = "dp_replicate * dp_shard * cp * tp * pp = 6, but the world size is 2"
TP_3 = [
    "must divide the model's 4 attention heads and 2 key/value heads, got 3",
    "must divide the model's 4 linear-attention (Gated DeltaNet) key heads and 8 value heads, got 3",
    "must divide the model's feed-forward hidden size 512, got 3",
]


@pytest.mark.parametrize("world_size", [None, "2"], ids=["without-the-world-size", "world-size-2"])
def test_one_error_of_each_kind_and_bad_flags_come_out_in_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world_size: str | None
) -> None:
    monkeypatch.delenv("HP_TEST_ONE_REPORT_UNSET", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    data = tmp_path / "missing.jsonl"
    path = tmp_path / "run.yaml"
    path.write_text(EACH_KIND_FILE.replace("DATA", str(data)))
    flags = [*EACH_KIND_FLAGS, *(["--world-size", world_size] if world_size else [])]
    code, lines = run(path, *flags)
    ranks = [f"{path}:18:13: parallelism.dp_shard: {RANKS}"]
    expected = [
        # a rule that spans groups
        f"{path}:6:12: tokenizer.add_eos: false has no effect while dataloader.dataset.pack_sequences is "
        "true: packed documents are always separated by EOS; set pack_sequences to false or remove add_eos",
        # the layout the stated degrees decide, world size or not
        f"{path}:8:3: training.seq_len: {SEQ_3}",
        f"{path}:9:22: training.global_batch_size: must be a multiple of micro_batch_size x dp_replicate x "
        "dp_shard (2), got 5",
        # an unknown field (its group's own checks wait for its names: see the last line)
        f"{path}:14:3: optimizer.betaz: unknown field 'betaz' for AdamW.Config; did you mean 'betas'?",
        *(f"{path}:17:7: parallelism.tp: {message}" for message in TP_3),
        # the layout with the world size
        *(ranks if world_size else []),
        # a target, a value of the wrong type
        f"{path}:20:13: lr_scheduler._target_: module 'hyper_parallel.components.lr_scheduler' has no "
        "attribute 'WarmupCosine'; did you mean 'WarmupDecay'?",
        f"{path}:23:13: metrics.log_freq: expected an integer, got the string 'ten'",
        # YAML: an interpolation, a duplicate key
        f"{path}:26:11: checkpoint.folder: environment variable HP_TEST_ONE_REPORT_UNSET is not set "
        "('${env:HP_TEST_ONE_REPORT_UNSET}'); set it, or give a default: "
        "'${env:HP_TEST_ONE_REPORT_UNSET,DEFAULT}'",
        f"{path}:27:3: checkpoint.folder: duplicate key 'folder' (first defined at line 26)",
        # a group's own check
        f"{path}:30:28: debug.deterministic_warn_only: has no effect unless deterministic is true; set "
        "deterministic: true or remove it",
        # the files the config names, where the file names them
        f"{path}:35:13: dataloader.dataset.paths[0]: '{data}' does not exist on this machine",
        # the flags: a model argument, a value, a group
        "--model.overrides.n_layer: unknown argument 'n_layer' of Qwen3_5Args; did you mean 'n_layers'?",
        "--optimizer.weight_decay: expected a number, got the string 'x'",
        "--trainin.max_steps: trainin: unknown root field 'trainin'; did you mean 'training'?",
    ]
    assert code == 2
    assert lines == [
        *expected,
        "not checked: the value checks of optimizer (a name in it is not known, and nothing of it runs "
        "before all are)",
        f"{len(expected)} problems found; nothing was started.",
    ]


def test_five_mistakes_and_an_impossible_layout_come_out_in_one_run(tmp_path: Path) -> None:
    """The audit's case: it took three runs (the five, then the batch, sequence and world size, then the
    heads)."""
    path = tmp_path / "run.yaml"
    path.write_text(
        "model:\n  _target_: hyper_parallel.models.qwen3_5.create_model_spec\n  flavor: debugmodel\n"
        "tokenizer:\n  _target_: hyper_parallel.components.tokenizer.ByteTokenizer.Config\n"
        "training:\n  _target_: hyper_parallel.trainer.config.TrainingConfig\n  global_batch_size: 5\n"
        "  micro_batch_size: 1\n"
        "optimizer:\n  _target_: hyper_parallel.components.optimizer.AdamW.Config\n  lr: -1.0\n  betaz: 0.9\n"
        "parallelism:\n  _target_: hyper_parallel.trainer.config.ParallelismConfig\n  tp: 3\n  dp_shard: 2\n"
        "lr_scheduler:\n  _target_: hyper_parallel.components.lr_scheduler.WarmupCosine.Config\n"
        "metrics:\n  _target_: hyper_parallel.components.metrics.MetricsLogger.Config\n  log_freq: ten\n"
        "debug:\n  _target_: hyper_parallel.trainer.config.DebugConfig\n  deterministic_warn_only: true\n"
        + DATA
    )
    code, lines = run(path, "--world-size", "2", "--optimizer.weight_decay", "x", "--trainin.max_steps", "5")
    assert code == 2
    assert lines == [
        f"{path}:7:3: training.seq_len: {SEQ_3}",
        f"{path}:8:22: training.global_batch_size: must be a multiple of micro_batch_size x dp_replicate x "
        "dp_shard (2), got 5",
        f"{path}:13:3: optimizer.betaz: unknown field 'betaz' for AdamW.Config; did you mean 'betas'?",
        *(f"{path}:16:7: parallelism.tp: {message}" for message in TP_3),
        f"{path}:17:13: parallelism.dp_shard: {RANKS}",
        f"{path}:19:13: lr_scheduler._target_: module 'hyper_parallel.components.lr_scheduler' has no "
        "attribute 'WarmupCosine'; did you mean 'WarmupDecay'?",
        f"{path}:22:13: metrics.log_freq: expected an integer, got the string 'ten'",
        f"{path}:25:28: debug.deterministic_warn_only: has no effect unless deterministic is true; set "
        "deterministic: true or remove it",
        "--optimizer.weight_decay: expected a number, got the string 'x'",
        "--trainin.max_steps: trainin: unknown root field 'trainin'; did you mean 'training'?",
        # optimizer.lr: -1.0 is told once its group's names are all known, in the next run
        "not checked: the value checks of optimizer (a name in it is not known, and nothing of it runs "
        "before all are)",
        "12 problems found; nothing was started.",
    ]


def test_a_later_check_an_error_makes_meaningless_is_named_in_one_line(tmp_path: Path) -> None:
    """A model that cannot be made leaves no config to run the rules and the file checks on: said so."""
    path = tmp_path / "run.yaml"
    path.write_text(
        "model:\n  _target_: hyper_parallel.models.qwen3_5.create_model_spec\n  flavor: debugmodel\n"
        "  overrides:\n    n_layer: 2\n"
        "parallelism:\n  _target_: hyper_parallel.trainer.config.ParallelismConfig\n  tp: 3\n" + DATA
    )
    code, lines = run(path)
    assert code == 2
    assert lines == [
        f"{path}:5:5: model.overrides.n_layer: unknown argument 'n_layer' of Qwen3_5Args; did you mean "
        "'n_layers'?",
        "not checked: the rules that span groups and the files the config names (no config could be made "
        "while these errors stand)",
        "1 problem found; nothing was started.",
    ]


def test_a_misspelled_target_hides_no_bad_model_argument_flag_and_an_unset_variable_hides_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HP_TEST_ONE_REPORT_UNSET", raising=False)
    path = tmp_path / "run.yaml"
    path.write_text(
        "model:\n  _target_: hyper_parallel.models.llama3.create_model_spec\n  flavor: debugmodel\n"
        "  weights_path: ${env:HP_TEST_ONE_REPORT_UNSET}\n"
        "tokenizer:\n  _target_: hyper_parallel.components.tokenizer.ByteTokenizer.Config\n"
        "  weights_path: ${env:HP_TEST_ONE_REPORT_UNSET}\n"
        "training:\n  _target_: hyper_parallel.trainer.config.TraningConfig\n" + DATA
    )
    code, lines = run(path, "--model.overrides.n_layer", "3", "--optimizer.lr", "x")
    assert code == 2
    unset = (
        "environment variable HP_TEST_ONE_REPORT_UNSET is not set ('${env:HP_TEST_ONE_REPORT_UNSET}'); set "
        "it, or give a default: '${env:HP_TEST_ONE_REPORT_UNSET,DEFAULT}'"
    )
    assert lines == [
        f"{path}:4:17: model.weights_path: {unset}",
        # a key that no field has is news, whatever its value
        f"{path}:7:3: tokenizer.weights_path: unknown field 'weights_path' for ByteTokenizer.Config; "
        "it is a field of 'model' (model.weights_path)",
        f"{path}:7:17: tokenizer.weights_path: {unset}",
        f"{path}:9:13: training._target_: module 'hyper_parallel.trainer.config' has no attribute "
        "'TraningConfig'; did you mean 'TrainingConfig'?",
        "--model.overrides.n_layer: unknown argument 'n_layer' of Llama3Args; did you mean 'n_layers'?",
        "--optimizer.lr: expected a number, got the string 'x'",
        # a rule spoke of the tokenizer's defaults, and the files are read by the groups that failed
        "not checked: the value checks of tokenizer (a name in it is not known, and nothing of it runs "
        "before all are); the rules that span groups, on tokenizer (tokenizer has errors); the files the "
        "config names (model, tokenizer, training have errors)",
        "6 problems found; nothing was started.",
    ]
