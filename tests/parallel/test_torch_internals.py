"""The torch.distributed internals the runtime still relies on, each held here: written against torch 2.13.0.

Everything else goes through public API. For each of these, no public API does the same in the supported
range (``torch>=2.11,<2.14``): if a release moves one or changes what the code assumes of it, the test that
names it fails here, with the place that uses it, before a run does.
"""

import inspect
import warnings
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

WRITTEN_AGAINST = "2.13.0"


def _parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def test_dcp_stores_every_chunk_as_a_storage_info_of_file_offset_and_length(tmp_path: Path) -> None:
    """``checkpoint/_bounds.py`` refuses a ``.metadata`` whose storage entries are not DCP's
    ``_StorageInfo`` (no public class), and ``checkpoint/_safe_read.py`` admits it by name when unpickling;
    both read its ``relative_path``, ``offset``, ``length`` and ``transform_descriptors``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    from hyper_parallel.components.checkpoint._safe_read import read_metadata

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # saving without a process group says so
        dcp.save(
            {"w": torch.arange(6.0).view(2, 3), "step": torch.tensor([1], dtype=torch.uint8)},
            checkpoint_id=tmp_path,
        )
    metadata = read_metadata(tmp_path / ".metadata")  # the restricted unpickler admits what DCP wrote
    entries = list(metadata.storage_data.values())
    assert entries, f"torch {torch.__version__} (written against {WRITTEN_AGAINST}) stored no entries"
    for info in entries:
        assert isinstance(info, _StorageInfo), type(info)
        assert isinstance(info.relative_path, str)
        assert isinstance(info.offset, int)
        assert isinstance(info.length, int)
        assert info.transform_descriptors in (None, [], ())


def test_replicate_with_fsdp_takes_the_mesh_and_the_policies() -> None:
    """``parallel/data_parallel.py``'s DDP layout: FSDP2's replicate, the one with FSDP2's policies."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    assert {"mesh", "mp_policy", "offload_policy"} <= set(_parameters(replicate))


def test_the_differentiable_all_to_all_takes_split_sizes_and_a_group() -> None:
    """``parallel/expert_parallel.py``'s dispatch: a traceable all-to-all with a backward."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    assert _parameters(all_to_all_single_autograd)[:4] == [
        "self",
        "output_split_sizes",
        "input_split_sizes",
        "group",
    ]


def test_process_groups_can_be_listed_given_a_timeout_and_aborted() -> None:
    """``parallel/process_group.py``: ``set_collective_timeout`` walks every group (``_world.pg_map``) and
    sets its timeout (``_set_pg_timeout``); ``shutdown`` aborts NCCL (``_abort_process_group``). PyTorch
    has no public setter or registry (TorchTitan uses the same hooks)."""
    from torch.distributed import distributed_c10d

    assert isinstance(distributed_c10d._world.pg_map, dict)
    assert _parameters(distributed_c10d._set_pg_timeout) == ["timeout", "group"]
    assert inspect.signature(distributed_c10d._set_pg_timeout).parameters["timeout"].annotation in (
        timedelta,
        "timedelta",
        "datetime.timedelta",
    )
    assert _parameters(distributed_c10d._abort_process_group) == ["group"]


def test_the_private_grouped_matmul_the_experts_fall_back_to_computes_what_the_public_one_does() -> None:
    """``qwen3_5_moe/_modules.py`` calls ``torch._grouped_mm`` where this torch has no public
    ``F.grouped_mm`` (releases of the supported range before it) with the public one's arguments,
    ``(tokens, weights transposed, offs=group ends)``; on this torch the module takes the public one."""
    from hyper_parallel.models.qwen3_5_moe import _modules

    assert _modules._GROUPED_MM is torch.nn.functional.grouped_mm
    x, w = torch.randn(8, 16), torch.randn(2, 32, 16)
    ends = torch.tensor([3, 8], dtype=torch.int32)
    per_group = torch.cat([x[:3] @ w[0].t(), x[3:] @ w[1].t()])
    private = torch._grouped_mm(x, w.transpose(-2, -1), offs=ends)
    public = torch.nn.functional.grouped_mm(x, w.transpose(-2, -1), offs=ends)
    torch.testing.assert_close(private, per_group)
    torch.testing.assert_close(public, private, rtol=0, atol=0)
