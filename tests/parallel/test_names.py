"""Parameter names without torch's module wrappers are the keys of torch's distributed state dicts.

Written against torch 2.13: ``checkpoint_wrapper`` (activation checkpointing of a module) and
``torch.compile`` of a module insert ``_checkpoint_wrapped_module.`` and ``_orig_mod.`` into
``named_parameters``, and ``get_model_state_dict`` leaves both out. If a torch release renames a wrapper
or keys its state dicts otherwise, this fails before a checkpoint leaves a frozen tensor in or out.
"""

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_model_state_dict  # noqa: E402

from hyper_parallel.parallel.names import WRAPPER_PREFIXES, unwrapped_name  # noqa: E402


def test_the_names_of_a_checkpointed_and_compiled_model_match_its_state_dict_keys() -> None:
    model = nn.Sequential(checkpoint_wrapper(nn.Linear(2, 3)), nn.Linear(3, 1))
    compiled = torch.compile(model)
    names = [name for name, _ in compiled.named_parameters()]
    assert all(any(prefix in name for prefix in WRAPPER_PREFIXES) for name in names)
    assert sorted(unwrapped_name(name) for name in names) == sorted(get_model_state_dict(compiled))
    assert unwrapped_name("_orig_mod.0._checkpoint_wrapped_module.weight") == "0.weight"
