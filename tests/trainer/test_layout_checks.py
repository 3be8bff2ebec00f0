"""Resolve-time refusal of parallel layouts the runtime cannot run (with and without the world size)."""

from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from hyper_parallel.config import ConfigError, load_config
from hyper_parallel.models import llama3, qwen3_5
from hyper_parallel.models.llama3.args import Llama3Args
from hyper_parallel.trainer import rules
from hyper_parallel.trainer.config import ParallelismConfig
from tests.support.trainer import debug_config_path, tiny_overrides

LLAMA = "hyper_parallel.models.llama3.create_model_spec"
QWEN = "hyper_parallel.models.qwen3_5.create_model_spec"
QWEN_VL = "hyper_parallel.models.qwen3_5.create_vl_model_spec"
PARALLELISM = "hyper_parallel.trainer.config.ParallelismConfig"

CP = (
    "context parallelism is not supported yet: PyTorch's ring attention covers only the CUDA flash, "
    "memory-efficient and cuDNN attention kernels, not CPU attention with gloo, so this release cannot "
    "test it; use 1, and for long sequences use tp with sequence_parallel and activation_checkpoint"
)
MOE = "hyper_parallel.models.qwen3_5_moe.create_model_spec"
EP_DENSE = (
    "expert parallelism needs a model with experts, but llama3 debugmodel is dense; use 1, or a "
    "mixture-of-experts model such as hyper_parallel.models.qwen3_5_moe.create_model_spec, got 2"
)


def _config(
    tmp_path: Path, model: str, flavor: str, parallelism: dict[str, Any], **groups: dict[str, Any]
) -> Path:
    path = tmp_path / "config.yaml"
    document = {
        "model": {"_target_": model, "flavor": flavor, "weights_path": "/weights"},  # the tokenizer source
        "parallelism": {"_target_": PARALLELISM, **parallelism},
        "training": {"_target_": "hyper_parallel.trainer.config.TrainingConfig", "global_batch_size": 16},
        **groups,
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _issues(path: Path, world_size: int | None) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        load_config(path, world_size=world_size)
    return [(issue.path, issue.message) for issue in info.value.issues]


# Refused whatever the world size: explicit values of what this release cannot run.
NOT_YET = [
    ({"dp_shard": 1, "cp": 2}, None, [("parallelism.cp", f"{CP}, got 2")]),
    ({"ep": 2}, None, [("parallelism.ep", EP_DENSE)]),
    # Auto degrees are refused once the world size says what they become.
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
    # Without the world size, a stated tp is refused all the same (what --dry-run says of it); one left
    # at -1 is unknown until the world size says what it becomes.
    if parallelism["tp"] == -1:
        load_config(path)
    else:
        assert _issues(path, None) == expected


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
    assert list(rules.sequence_parallel_issues(without_plan, 2)) == [refusal]
    assert without_plan.world_size_issues(4) == [refusal]
    assert list(rules.sequence_parallel_issues(attrs.evolve(without_plan, model=cfg.model), 2)) == []


def _pipeline(**flags: str) -> dict[str, str]:
    return {"parallelism.dp_shard": "1", "parallelism.pp": "2", **flags}


_TINY_LAYERS = {"model.overrides.n_layers": "4"}
_INTERLEAVED = {"parallelism.pp_schedule": "Interleaved1F1B"}
_MICRO_10 = {"training.micro_batch_size": "10", "training.global_batch_size": "10"}
_QWEN_PP = (
    "pipeline parallelism is not supported yet by Qwen 3.5 (its model is not split into pipeline stages); "
    "use 1 and scale with dp_shard (FSDP) or tp, got 2"
)

# The tiny debug configs of tests/support/trainer.py: 2 layers, micro-batches of 2, global batch 4.
PIPELINE_REFUSED = [
    (
        "micro-batch-not-split-by-pp",
        "llama3",
        _pipeline(**{"training.micro_batch_size": "1"}),
        None,
        [
            (
                "training.micro_batch_size",
                "must be a multiple of pp (2, set by overrides['parallelism.pp']) under pipeline "
                "parallelism: each micro-batch is one pipeline step, split into parallelism.pp_microbatches "
                "(null: pp) micro-batches, got 1",
            )
        ],
    ),
    (
        "microbatches-do-not-divide-the-micro-batch",
        "llama3",
        _pipeline(**{"parallelism.pp_microbatches": "4"}),
        None,
        [
            (
                "parallelism.pp_microbatches",
                "must divide training.micro_batch_size (2, set by overrides['training.micro_batch_size']): "
                "each training micro-batch is one pipeline step split into this many micro-batches, got 4",
            )
        ],
    ),
    (
        "1f1b-needs-pp-microbatches",
        "llama3",
        _pipeline(**{"parallelism.pp_microbatches": "1"}),
        None,
        [
            (
                "parallelism.pp_microbatches",
                "1F1B needs at least pp (2, set by overrides['parallelism.pp']) micro-batches per pipeline "
                "step, got 1",
            )
        ],
    ),
    (
        "more-stages-than-layers",
        "llama3",
        _pipeline(
            **{"parallelism.pp": "3", "training.micro_batch_size": "3", "training.global_batch_size": "3"}
        ),
        None,
        [("parallelism.pp", "must be <= the model's 2 layers, got 3 stages")],
    ),
    (
        "interleaved-needs-two-layers-per-rank",
        "llama3",
        _pipeline(**_INTERLEAVED),
        None,
        [
            (
                "parallelism.pp_schedule",
                "Interleaved1F1B holds 2 stages per pipeline rank, so pp = 2 needs 4 stages of at least one "
                "layer, but the model has 2 layers; use 1F1B or GPipe, or a smaller pp",
            )
        ],
    ),
    (
        "interleaved-microbatches-in-rounds",
        "llama3",
        _pipeline(**_INTERLEAVED, **_TINY_LAYERS, **_MICRO_10, **{"parallelism.pp_microbatches": "5"}),
        None,
        [
            (
                "parallelism.pp_microbatches",
                "Interleaved1F1B runs the micro-batches in 2 rounds (pp_microbatches // pp), so it must be a "
                "multiple of 2, got 5; a multiple of pp (2, set by overrides['parallelism.pp']) always works",
            )
        ],
    ),
    (
        "validation-is-not-pipelined",
        "llama3",
        _pipeline(**{"validator.enable": "true", "validator.freq": "2"}),
        None,
        [
            (
                "validator.enable",
                "validation is not supported yet with pipeline parallelism (parallelism.pp = 2); set it to "
                "false",
            )
        ],
    ),
    ("qwen3_5-is-not-split-yet", "qwen3_5", _pipeline(), None, [("parallelism.pp", _QWEN_PP)]),
    (
        "qwen3_5-at-the-world-size",
        "qwen3_5",
        _pipeline(**{"parallelism.pp": "-1"}),
        2,
        [("parallelism.pp", _QWEN_PP)],
    ),
    (
        "auto-pp-checked-at-the-world-size",
        "llama3",
        _pipeline(**{"parallelism.pp": "-1", "training.micro_batch_size": "1"}),
        2,
        [
            (
                "training.micro_batch_size",
                "must be a multiple of pp (2) under pipeline parallelism: each micro-batch is one pipeline "
                "step, split into parallelism.pp_microbatches (null: pp) micro-batches, got 1",
            )
        ],
    ),
]


@pytest.mark.parametrize(
    ("model", "flags", "world_size", "expected"),
    [case[1:] for case in PIPELINE_REFUSED],
    ids=[case[0] for case in PIPELINE_REFUSED],
)
def test_pipeline_layouts_the_schedule_cannot_run_are_refused(
    model: str, flags: dict[str, str], world_size: int | None, expected: list[tuple[str, str]]
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(debug_config_path(model), {**tiny_overrides(model), **flags}, world_size=world_size)
    assert [(issue.path, issue.message) for issue in info.value.issues] == expected


@pytest.mark.parametrize(
    "flags",
    [
        _pipeline(),
        _pipeline(**{"parallelism.pp_schedule": "GPipe", "parallelism.pp_microbatches": "1"}),
        _pipeline(**_INTERLEAVED, **_TINY_LAYERS),
        _pipeline(**_INTERLEAVED, **_TINY_LAYERS, **_MICRO_10, **{"parallelism.pp_microbatches": "10"}),
        _pipeline(**{"parallelism.pp_schedule": "ZBVZeroBubble"}, **_TINY_LAYERS),
        _pipeline(**{"parallelism.pp": "-1"}),
    ],
)
def test_pipeline_layouts_the_schedules_run_resolve(flags: dict[str, str]) -> None:
    cfg = load_config(debug_config_path("llama3"), {**tiny_overrides("llama3"), **flags}, world_size=2)
    assert cfg.parallelism.resolved_degrees(2)["pp"] == 2


# Expert parallelism: a model with experts, ep dividing its experts and dp_shard x cp, no tp or HSDP yet.
EP_RULES = [
    ({"ep": 2}, 4, []),
    ({"ep": 4, "dp_shard": 4}, 4, []),
    (
        {"ep": 3},
        4,
        [
            ("parallelism.ep", "must divide the model's 8 experts (model.args.n_experts), got 3"),
            ("parallelism.ep", "must divide dp_shard * cp (4 with world size 4), got 3"),
        ],
    ),
    # Stated degrees decide both without the world size, and both are reported.
    (
        {"ep": 3, "dp_shard": 4},
        None,
        [
            ("parallelism.ep", "must divide dp_shard * cp (4), got 3"),
            ("parallelism.ep", "must divide the model's 8 experts (model.args.n_experts), got 3"),
        ],
    ),
    (
        {"ep": 16},
        16,
        [("parallelism.ep", "must divide the model's 8 experts (model.args.n_experts), got 16")],
    ),
    (
        {"ep": 2, "dp_shard": 2, "tp": 2, "sequence_parallel": False},
        4,
        [
            (
                "parallelism.tp",
                "tensor parallelism is not supported yet by Qwen 3.5 MoE (its experts are not split by tp); "
                "shard the experts with parallelism.ep and the rest with dp_shard, got 2",
            )
        ],
    ),
    (
        {"ep": 2, "dp_shard": 2, "dp_replicate": 2},
        None,
        [
            (
                "parallelism.ep",
                "expert parallelism with dp_replicate > 1 (HSDP, 2) is not supported yet; shard over "
                "dp_shard instead, got ep 2",
            )
        ],
    ),
]


@pytest.mark.parametrize(
    ("flags", "path", "message"),
    [
        (
            {"compile.enable": "true", "compile.fullgraph": "true"},
            "compile.fullgraph",
            "a mixture-of-experts model compiles with graph breaks only (its grouped expert matmul runs "
            "eagerly outside bfloat16, and under expert parallelism the all-to-all reads its split sizes on "
            "the host); use fullgraph: false",
        ),
    ],
    ids=["fullgraph"],
)
def test_what_expert_parallelism_cannot_run_with_is_refused_at_resolve_time(
    flags: dict[str, str], path: str, message: str
) -> None:
    """Activation checkpointing (whole blocks and operators: tests/trainer/test_expert_parallel.py and
    test_parallel.py) and compile with graph breaks run under ep (compile measured by hand, too slow for
    the suite)."""
    moe = {**tiny_overrides("qwen3_5_moe"), "parallelism.dp_shard": "2", "parallelism.ep": "2"}
    with pytest.raises(ConfigError) as info:
        load_config(debug_config_path("qwen3_5_moe"), {**moe, **flags}, world_size=2)
    assert [(issue.path, issue.message) for issue in info.value.issues] == [(path, message)]
    op = {"activation_checkpoint.mode": "selective", "activation_checkpoint.selective_option": "op"}
    for ok in ({"activation_checkpoint.mode": "full"}, op, {"compile.enable": "true"}):
        assert load_config(debug_config_path("qwen3_5_moe"), {**moe, **ok}, world_size=2).parallelism.ep == 2


@pytest.mark.parametrize(("parallelism", "world_size", "expected"), EP_RULES)
def test_expert_parallel_layouts_are_checked_at_resolve_time(
    tmp_path: Path, parallelism: dict[str, Any], world_size: int | None, expected: list[tuple[str, str]]
) -> None:
    # whole-block checkpointing (any mode runs under ep: test above)
    ac = {"_target_": "hyper_parallel.trainer.config.ActivationCheckpointConfig", "mode": "full"}
    path = _config(tmp_path, MOE, "debugmodel", parallelism, activation_checkpoint=ac)
    if not expected:
        cfg = load_config(path, world_size=world_size)
        assert cfg.parallelism.resolved_degrees(world_size or 1)["ep"] == parallelism["ep"]
        return
    assert _issues(path, world_size) == expected


def _dry_run(path: Path, *flags: str) -> tuple[int, list[str]]:
    import io

    from hyper_parallel.launch import main

    out, err = io.StringIO(), io.StringIO()
    code = main(["--config-file", str(path), "--dry-run", "--no-file-checks", *flags], out=out, err=err)
    return code, err.getvalue().splitlines()


def test_dry_run_without_the_world_size_refuses_a_stated_tp_the_launch_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    data = {"_target_": "hyper_parallel.components.dataloader.TextDataLoader.Config"}
    data["dataset"] = {"source": "python_docs"}  # type: ignore[assignment]
    path = _config(tmp_path, QWEN, "debugmodel", {}, dataloader=data)  # 4 heads, 2 key/value heads
    assert _dry_run(path, "--parallelism.tp", "4") == (
        2,
        [f"--parallelism.tp: {_heads(4, 2, 4)}", "1 problem found; nothing was started."],
    )
    stated = _config(tmp_path, QWEN, "debugmodel", {"tp": 4, "dp_shard": 2}, dataloader=data)
    assert _dry_run(stated) == (
        2,
        [f"{stated}:7:7: parallelism.tp: {_heads(4, 2, 4)}", "1 problem found; nothing was started."],
    )


def test_every_problem_of_the_stated_degrees_is_reported_without_the_world_size(tmp_path: Path) -> None:
    """Heads, key/value heads, the pipeline, the micro-batch split, the sequence and batch splits: all
    at once."""
    path = _config(tmp_path, QWEN, "debugmodel", {"tp": 3, "dp_shard": 5, "pp": 2})
    assert _issues(path, None) == [
        ("parallelism.tp", _heads(4, 2, 3)),
        (
            "parallelism.tp",
            "must divide the model's 4 linear-attention (Gated DeltaNet) key heads and 8 value heads, got 3",
        ),
        ("parallelism.tp", "must divide the model's feed-forward hidden size 512, got 3"),
        ("parallelism.pp", _QWEN_PP),
        (
            "training.micro_batch_size",
            "must be a multiple of pp (2) under pipeline parallelism: each micro-batch is one pipeline "
            "step, split into parallelism.pp_microbatches (null: pp) micro-batches, got 1",
        ),
        ("training.seq_len", SEQ_SPLIT),
        (
            "training.global_batch_size",
            "must be a multiple of micro_batch_size x dp_replicate x dp_shard (5), got 16",
        ),
    ]
