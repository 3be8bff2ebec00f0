"""``--dry-run`` refuses a model no machine could hold, with the preflight's parameter count (N3)."""

from __future__ import annotations

import io

import pytest

from hyper_parallel.launch import main
from hyper_parallel.preflight.limits import MAX_PARAMETERS
from tests.support.trainer import debug_config_path


@pytest.mark.parametrize("flag", ["--dry-run", "--print-config"])
def test_ten_million_layers_are_refused_with_the_count(flag: str) -> None:
    config = str(debug_config_path("llama3"))
    out, err = io.StringIO(), io.StringIO()
    assert (
        main(["--config-file", config, "--model.overrides.n_layers", "10000000", flag], out=out, err=err) == 2
    )
    assert err.getvalue().startswith(
        f"{config}: model: llama3 debugmodel with these arguments has 7,377,920,262,400 parameters, more "
        f"than {MAX_PARAMETERS:,} (2^42, four times the largest model trained in the open): no machine "
        "holds it"
    )
    assert out.getvalue() == ""


def test_the_shipped_8b_config_is_far_below_the_limit() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert (
        main(
            [
                "--config-file",
                str(debug_config_path("llama3")).replace("_debug", "_8b"),
                "--dry-run",
                "--no-file-checks",  # the shipped config names placeholder files
            ],
            out=out,
            err=err,
        )
        == 0
    )
    assert "8.03 B" in out.getvalue()
