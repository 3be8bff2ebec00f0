"""Splitting a model into pipeline stages: ownership, unchanged parameter names, the same computation."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.models import llama3  # noqa: E402
from hyper_parallel.parallel.pipeline import (  # noqa: E402
    merge_stages,
    split_stage,
    stage_indices,
    stage_layers,
)

ARGS = {"dim": 64, "n_layers": 5, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 128, "multiple_of": 32}


def _model() -> torch.nn.Module:
    spec = llama3.create_model_spec("debugmodel", overrides=ARGS)
    torch.manual_seed(0)
    return spec.build_model_fn(spec.args, device="cpu")


@pytest.mark.parametrize(
    ("n_layers", "stages", "expected"),
    [
        (4, 2, [[0, 1], [2, 3]]),
        (5, 2, [[0, 1], [2, 3, 4]]),
        (7, 4, [[0], [1, 2], [3, 4], [5, 6]]),
        (6, 4, [[0], [1, 2], [3, 4], [5]]),
        (4, 4, [[0], [1], [2], [3]]),
    ],
)
def test_blocks_are_dealt_contiguously_and_evenly(
    n_layers: int, stages: int, expected: list[list[int]]
) -> None:
    assert [list(r) for r in stage_layers(n_layers, stages)] == expected


def test_more_stages_than_blocks_is_an_error() -> None:
    with pytest.raises(ValueError, match="cannot split 2 blocks into 4 non-empty pipeline stages"):
        stage_layers(2, 4)


@pytest.mark.parametrize(
    ("rank", "pp", "per_rank", "v_shape", "expected"),
    [
        (0, 2, 1, False, [0]),
        (1, 2, 1, False, [1]),
        (0, 2, 2, False, [0, 2]),
        (1, 2, 2, False, [1, 3]),
        (0, 2, 2, True, [0, 3]),
        (1, 2, 2, True, [1, 2]),
        (2, 4, 2, True, [2, 5]),
    ],
)
def test_stages_held_by_each_rank(
    rank: int, pp: int, per_rank: int, v_shape: bool, expected: list[int]
) -> None:
    assert stage_indices(rank, pp, per_rank, v_shape=v_shape) == expected


def test_stages_keep_the_names_of_the_whole_model_and_compose_to_its_forward() -> None:
    model = _model()
    ranges = stage_layers(5, 3)
    stages = [
        split_stage(model, layers, first=index == 0, last=index == 2) for index, layers in enumerate(ranges)
    ]
    names = [[name for name, _ in stage.named_parameters()] for stage in stages]
    whole = [name for name, _ in model.named_parameters()]
    assert names[0][0] == "tok_embeddings.weight"
    assert names[2][-2:] == ["norm.weight", "output.weight"]
    assert {n.split(".")[1] for n in names[1]} == {"1", "2"}  # layers.1.*, layers.2.*
    assert sorted(name for stage in names for name in stage) == sorted(whole)
    assert (stages[1].tok_embeddings, stages[1].norm, stages[1].output) == (None, None, None)
    tokens = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    documents = torch.tensor([[0] * 5 + [1] * 7, [0] * 12])
    for kwargs in ({}, {"document_ids": documents}):
        h = tokens
        for stage in stages:
            h = stage(h, **kwargs)
        torch.testing.assert_close(h, model(tokens, **kwargs), rtol=0, atol=0)
    merged = merge_stages([stages[0], stages[2]])
    assert [n for n, _ in merged.named_parameters()] == [*names[0], *names[2]]
    assert merged.get_parameter("layers.3.attention.wq.weight") is stages[2].get_parameter(
        "layers.3.attention.wq.weight"
    )


def test_a_model_without_a_block_dict_cannot_be_split() -> None:
    plain = torch.nn.Module()
    plain.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    with pytest.raises(TypeError, match=r"Module\.layers must be an nn.ModuleDict keyed by block index"):
        split_stage(plain, range(1), first=True, last=True)
