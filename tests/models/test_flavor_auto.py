"""``flavor: auto``: a native model's arguments read from its weights folder's ``config.json``.

The table's flavor whose ``config.json`` the folder holds is picked by name (its own arguments); a folder
of no flavor gives the arguments it describes, named ``config.json``; ``overrides`` apply on top. Without
``weights_path``, without the file, or with another model's ``model_type``, the factory refuses in one
line. A ``weights_path`` not on this machine leaves the flavor unread (the default flavor's arguments)
until the launch, whose file checks refuse or fetch it (its title says so). ``flavor`` left out is
``auto`` where ``weights_path`` is given, else the family's default, and a config dumped loads back equal.
Torch-free: the folders hold only the ``config.json`` the state-dict adapters write.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from hyper_parallel.models.llama3 import LLAMA3_FLAVORS, Llama3Args
from hyper_parallel.models.llama3 import create_model_spec as llama3
from hyper_parallel.models.llama3._runtime import Llama3StateDictAdapter
from hyper_parallel.models.qwen3_5 import QWEN3_5_FLAVORS
from hyper_parallel.models.qwen3_5 import create_model_spec as qwen3_5
from hyper_parallel.models.qwen3_5._runtime import Qwen3_5StateDictAdapter


def _folder(tmp_path: Path, config: dict[str, object]) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize(
    ("factory", "adapter", "table", "flavor"),
    [
        (llama3, Llama3StateDictAdapter, LLAMA3_FLAVORS, "1B"),
        (qwen3_5, Qwen3_5StateDictAdapter, QWEN3_5_FLAVORS, "0.8B"),
    ],
)
def test_auto_picks_the_flavor_whose_config_json_the_folder_holds(
    factory: object, adapter: type, table: dict[str, object], flavor: str, tmp_path: Path
) -> None:
    path = _folder(tmp_path, adapter(table[flavor]).hf_config())
    spec = factory(flavor="auto", weights_path=path)  # type: ignore[operator]
    assert (spec.flavor, spec.weights_path) == (flavor, path)
    assert spec.args == table[flavor]


def test_a_folder_of_no_flavor_gives_its_own_arguments_and_overrides_apply_on_top(tmp_path: Path) -> None:
    own = attrs.evolve(LLAMA3_FLAVORS["debugmodel"], n_layers=3)
    path = _folder(tmp_path, Llama3StateDictAdapter(own).hf_config())
    spec = llama3(flavor="auto", weights_path=path)
    assert spec.flavor == "config.json"
    assert isinstance(spec.args, Llama3Args)
    assert Llama3StateDictAdapter(spec.args).hf_config() == Llama3StateDictAdapter(own).hf_config()
    assert llama3(flavor="auto", weights_path=path, overrides={"n_layers": 2}).args.num_layers() == 2


def test_auto_without_the_file_or_with_another_model_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="set model") as caught:
        llama3(flavor="auto")
    assert str(caught.value) == (
        "flavor 'auto' reads the architecture from model.weights_path's config.json: set model.weights_path, "
        "or name a flavor ('debugmodel', '1B', '3B', '8B', '70B', '405B')"
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="does not exist") as caught:
        llama3(flavor="auto", weights_path=str(tmp_path / "empty"))
    assert str(caught.value) == (
        f"{tmp_path / 'empty' / 'config.json'}: does not exist (flavor 'auto' reads the architecture from it)"
    )
    path = _folder(tmp_path / "qwen", Qwen3_5StateDictAdapter(QWEN3_5_FLAVORS["0.8B"]).hf_config())
    with pytest.raises(ValueError, match="model_type") as caught:
        llama3(flavor="auto", weights_path=path)
    assert str(caught.value) == f"{path}/config.json: model_type 'qwen3_5_text' is not llama3's ('llama')"


def test_a_folder_not_on_this_machine_leaves_auto_unread_with_the_default_flavors_arguments(
    tmp_path: Path,
) -> None:
    missing = str(tmp_path / "none")
    for spec in (llama3(flavor="auto", weights_path=missing), llama3(weights_path=missing)):
        assert (spec.flavor, spec.flavor_unread, spec.weights_path) == ("auto", True, missing)
        assert spec.args == LLAMA3_FLAVORS["8B"]
    assert qwen3_5(weights_path=missing).args == QWEN3_5_FLAVORS["0.8B"]


def test_no_flavor_is_auto_with_weights_path_and_the_default_without(tmp_path: Path) -> None:
    path = _folder(tmp_path, Llama3StateDictAdapter(LLAMA3_FLAVORS["1B"]).hf_config())
    assert (llama3(weights_path=path).flavor, llama3().flavor, qwen3_5().flavor) == ("1B", "8B", "0.8B")
    assert not llama3(weights_path=path).flavor_unread


def test_a_dumped_config_of_no_flavor_loads_back_equal(tmp_path: Path) -> None:
    from hyper_parallel.config import dump_config, load_config

    path = _folder(tmp_path / "w", Llama3StateDictAdapter(LLAMA3_FLAVORS["1B"]).hf_config())
    for weights in (path, str(tmp_path / "none")):
        config = tmp_path / "run.yaml"
        config.write_text(
            f"model:\n  _target_: hyper_parallel.models.llama3.create_model_spec\n  weights_path: {weights}\n"
        )
        loaded = load_config(config)
        dumped = dump_config(loaded)
        assert "  flavor: null\n" in dumped
        (tmp_path / "dumped.yaml").write_text(dumped)
        assert load_config(tmp_path / "dumped.yaml") == loaded
        unread = "auto (config.json not read yet: the default flavor's sizes)"
        assert loaded.model.title() == f"llama3 {unread if weights != path else '1B'}"
