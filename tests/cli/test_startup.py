"""How a command starts and ends: the cyclic collector paused while the config is read, back on to train."""

import gc
from pathlib import Path
from typing import Any

import pytest

from hyper_parallel import launch
from hyper_parallel._cli import collection_paused

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("enabled", [True, False])
def test_collection_paused_restores_what_it_found(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with collection_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(KeyError), collection_paused():
            raise KeyError("x")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_the_config_is_read_with_the_collector_paused_and_training_gets_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, bool] = {}
    real_load = launch.load_config_report

    def load(*args: Any, **kwargs: Any) -> Any:
        seen["reading"] = gc.isenabled()
        return real_load(*args, **kwargs)

    def train(cfg: Any, prog: str, out: Any, err: Any) -> int:
        seen["training"] = gc.isenabled()
        seen["steps"] = cfg.training.max_steps
        return 0

    monkeypatch.setattr(launch, "load_config_report", load)
    monkeypatch.setattr(launch, "_train", train)
    assert gc.isenabled()
    config = str(REPO / "configs" / "llama3_debug.yaml")
    status = launch.main(["--config-file", config, "--training.max_steps", "3"])
    assert status == 0
    assert seen == {"reading": False, "training": True, "steps": 3}
    assert gc.isenabled()
