"""Resolve-time refusal of parallel layouts the runtime cannot run (with and without the world size)."""

from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from hyper_parallel.config import ConfigError, load_config
from hyper_parallel.models import llama3, qwen3_5
from hyper_parallel.models.llama3.args import Llama3Args
from hyper_parallel.trainer.config import ParallelismConfig

LLAMA = "hyper_parallel.models.llama3.create_model_spec"
QWEN = "hyper_parallel.models.qwen3_5.create_model_spec"
QWEN_VL = "hyper_parallel.models.qwen3_5.create_vl_model_spec"
PARALLELISM = "hyper_parallel.trainer.config.ParallelismConfig"

PP = "pipeline parallelism is not supported yet; use 1 and scale with dp_shard (FSDP) or tp"
CP = (
    "context parallelism is not supported yet: PyTorch's ring attention covers only the CUDA flash, "
    "memory-efficient and cuDNN attention kernels, not CPU attention with gloo, so this release cannot "
    "test it; use 1, and for long sequences use tp with sequence_parallel and activation_checkpoint"
)
EP = "expert parallelism is not supported yet: no built-in model has experts; use 1"
SCHEDULE = (
    "is not supported yet: pipeline parallelism is not available, so a schedule would be ignored; "
    "leave the default '1F1B', got 'GPipe'"
)
MICROBATCHES = (
    "is not supported yet: pipeline parallelism is not available, so it would be ignored; "
    "leave it null, got 4"
)


def _config(tmp_path: Path, model: str, flavor: str, parallelism: dict[str, Any]) -> Path:
    path = tmp_path / "config.yaml"
    document = {
        "model": {"_target_": model, "flavor": flavor, "weights_path": "/weights"},  # the tokenizer source
        "parallelism": {"_target_": PARALLELISM, **parallelism},
        "training": {"_target_": "hyper_parallel.trainer.config.TrainingConfig", "global_batch_size": 16},
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _issues(path: Path, world_size: int | None) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        load_config(path, world_size=world_size)
    return [(issue.path, issue.message) for issue in info.value.issues]


# Refused whatever the world size: explicit values of what this release cannot run.
NOT_YET = [
    ({"dp_shard": 1, "pp": 2}, None, [("parallelism.pp", f"{PP}, got 2")]),
    ({"dp_shard": 1, "cp": 2}, None, [("parallelism.cp", f"{CP}, got 2")]),
    ({"ep": 2}, None, [("parallelism.ep", f"{EP}, got 2")]),
    ({"pp_schedule": "GPipe"}, None, [("parallelism.pp_schedule", SCHEDULE)]),
    ({"pp_microbatches": 4}, None, [("parallelism.pp_microbatches", MICROBATCHES)]),
    # Auto degrees are refused once the world size says what they become.
    ({"dp_shard": 1, "pp": -1}, 2, [("parallelism.pp", f"{PP}, got 2 (inferred from the world size)")]),
    ({"dp_shard": 1, "cp": -1}, 4, [("parallelism.cp", f"{CP}, got 4 (inferred from the world size)")]),
]


@pytest.mark.parametrize(("parallelism", "world_size", "expected"), NOT_YET)
def test_layouts_not_supported_yet_are_refused(
    tmp_path: Path, parallelism: dict[str, Any], world_size: int | None, expected: list[tuple[str, str]]
) -> None:
    assert _issues(_config(tmp_path, LLAMA, "debugmodel", parallelism), world_size) == expected


def _heads(heads: int, kv: int, tp: int) -> str:
    return f"must divide the model's {heads} attention heads and {kv} key/value heads, got {tp}"


# Refused once the world size resolves the degrees: the model's own limits.
MODEL_LIMITS = [
    (LLAMA, "debugmodel", {"tp": 3, "sequence_parallel": False}, 6, [("parallelism.tp", _heads(8, 4, 3))]),
    (LLAMA, "debugmodel", {"tp": -1, "dp_shard": 1}, 8, [("parallelism.tp", _heads(8, 4, 8))]),
    (LLAMA, "8B", {"tp": 16}, 16, [("parallelism.tp", _heads(32, 8, 16))]),
    (QWEN, "debugmodel", {"tp": 4}, 4, [("parallelism.tp", _heads(4, 2, 4))]),
    (
        QWEN,
        "4B",
        {"tp": 8},
        8,
        [
            ("parallelism.tp", _heads(16, 4, 8)),
        ],
    ),
    (
        QWEN,
        "0.8B",
        {"tp": 32},
        32,
        [
            ("parallelism.tp", _heads(8, 2, 32)),
            (
                "parallelism.tp",
                "must divide the model's 16 linear-attention (Gated DeltaNet) key heads and 16 value heads, "
                "got 32",
            ),
        ],
    ),
    (
        QWEN,
        "debugmodel",
        {"tp": 3, "sequence_parallel": False},  # else seq_len 2048 must split over 3 ranks
        3,
        [
            ("parallelism.tp", _heads(4, 2, 3)),
            (
                "parallelism.tp",
                "must divide the model's 4 linear-attention (Gated DeltaNet) key heads and 8 value heads, "
                "got 3",
            ),
            ("parallelism.tp", "must divide the model's feed-forward hidden size 512, got 3"),
        ],
    ),
    (QWEN_VL, "debugmodel", {"tp": 4}, 4, [("parallelism.tp", _heads(4, 2, 4))]),
]


@pytest.mark.parametrize(("model", "flavor", "parallelism", "world_size", "expected"), MODEL_LIMITS)
def test_tensor_parallel_degree_must_split_the_heads(
    tmp_path: Path,
    model: str,
    flavor: str,
    parallelism: dict[str, Any],
    world_size: int,
    expected: list[tuple[str, str]],
) -> None:
    path = _config(tmp_path, model, flavor, parallelism)
    assert _issues(path, world_size) == expected
    load_config(path)  # without a world size the degrees are unknown: nothing to refuse yet


@pytest.mark.parametrize(
    ("model", "flavor", "parallelism", "world_size"),
    [
        (LLAMA, "debugmodel", {"tp": 2}, 4),
        (LLAMA, "debugmodel", {"tp": 4, "dp_shard": 1}, 4),
        (LLAMA, "8B", {"tp": 8}, 16),
        (QWEN, "debugmodel", {"tp": 2}, 2),
        (QWEN, "debugmodel", {"tp": 2, "sequence_parallel": False}, 2),
        (QWEN, "0.8B", {"tp": 2}, 8),
        (QWEN_VL, "debugmodel", {"tp": 2}, 4),  # the vision tower's 4 heads are not split
        (LLAMA, "debugmodel", {}, 8),
    ],
)
def test_supported_layouts_pass(
    tmp_path: Path, model: str, flavor: str, parallelism: dict[str, Any], world_size: int
) -> None:
    cfg = load_config(_config(tmp_path, model, flavor, parallelism), world_size=world_size)
    assert cfg.parallelism.resolved_degrees(world_size)["tp"] == parallelism.get("tp", 1)


@pytest.mark.parametrize(
    ("model", "parallelism", "world_size", "expected"),
    [
        (LLAMA, {"dp_replicate": 2, "dp_shard": 1}, 2, {"dp_replicate": 2, "dp_shard": 1}),  # DDP
        (LLAMA, {"dp_replicate": 2}, 4, {"dp_replicate": 2, "dp_shard": 2}),  # HSDP, dp_shard inferred
        (LLAMA, {"dp_replicate": -1, "dp_shard": 1}, 2, {"dp_replicate": 2, "dp_shard": 1}),
        (LLAMA, {"dp_replicate": 2, "tp": 2}, 8, {"dp_replicate": 2, "dp_shard": 2, "tp": 2}),
        (QWEN, {"dp_replicate": 2, "dp_shard": 2}, 4, {"dp_replicate": 2, "dp_shard": 2}),
        (QWEN, {"dp_replicate": 2, "tp": 2, "sequence_parallel": False}, 4, {"dp_replicate": 2, "tp": 2}),
    ],
)
def test_data_parallel_replication_passes(
    tmp_path: Path, model: str, parallelism: dict[str, Any], world_size: int, expected: dict[str, int]
) -> None:
    cfg = load_config(_config(tmp_path, model, "debugmodel", parallelism), world_size=world_size)
    degrees = cfg.parallelism.resolved_degrees(world_size)
    assert {name: degrees[name] for name in expected} == expected
    assert degrees["dp_replicate"] * degrees["dp_shard"] * degrees["tp"] == world_size


def test_parallel_issues_defaults_and_paths() -> None:
    degrees = ParallelismConfig(tp=2).resolved_degrees(4)
    assert list(llama3.create_model_spec("debugmodel").args.parallel_issues(degrees)) == []
    vl = qwen3_5.create_vl_model_spec("debugmodel", overrides={"vision.n_heads": 1, "vision.hidden_size": 33})
    assert list(vl.args.parallel_issues(degrees)) == []
    assert list(qwen3_5.create_model_spec("debugmodel").args.parallel_issues({"tp": 3})) == [
        ("parallelism.tp", _heads(4, 2, 3)),
        (
            "parallelism.tp",
            "must divide the model's 4 linear-attention (Gated DeltaNet) key heads and 8 value heads, got 3",
        ),
        ("parallelism.tp", "must divide the model's feed-forward hidden size 512, got 3"),
    ]


SEQ_SPLIT = (
    "must be divisible by parallelism.tp (3) for sequence parallelism (each tp rank holds an equal slice of "
    "the sequence; or set parallelism.sequence_parallel to false), got 2048"
)


@pytest.mark.parametrize("model", [LLAMA, QWEN, QWEN_VL])
@pytest.mark.parametrize(
    ("parallelism", "world_size"),
    [({"tp": 3, "dp_shard": 1}, None), ({"tp": -1, "dp_shard": 1}, 3)],
    ids=["explicit-tp", "tp-inferred-from-the-world-size"],
)
def test_sequence_parallel_needs_seq_len_divisible_by_tp(
    tmp_path: Path, model: str, parallelism: dict[str, Any], world_size: int | None
) -> None:
    # (with the world size, 3 ranks also fail to split the heads: reported beside it)
    assert ("training.seq_len", SEQ_SPLIT) in _issues(
        _config(tmp_path, model, "debugmodel", parallelism), world_size
    )


class _ArgsWithoutSequenceParallelPlan(Llama3Args):
    """A model whose tensor-parallel plan keeps activations replicated (as a user's model may)."""

    def supports_sequence_parallel(self) -> bool:
        return False


def test_sequence_parallel_is_refused_for_a_model_without_a_plan_for_it(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path, LLAMA, "debugmodel", {"tp": 2, "sequence_parallel": False}))
    args = _ArgsWithoutSequenceParallelPlan(**attrs.asdict(cfg.model.args, recurse=False))
    model = attrs.evolve(cfg.model, name="mine", args=args)
    without_plan = attrs.evolve(
        cfg, model=model, parallelism=attrs.evolve(cfg.parallelism, sequence_parallel=True)
    )
    refusal = (
        "parallelism.sequence_parallel",
        "is not supported yet by mine (its tensor-parallel plan keeps activations replicated); "
        "set it to false",
    )
    assert list(without_plan.sequence_parallel_issues(2)) == [refusal]
    assert without_plan.world_size_issues(4) == [refusal]
    assert list(attrs.evolve(without_plan, model=cfg.model).sequence_parallel_issues(2)) == []
