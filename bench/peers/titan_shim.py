"""What TorchTitan 0.3.0 needs that this project's images lack, replaced for data loading, logging and the
CPU only: never its model, its parallelisms (``parallelize_llama``: FSDP2, compile) or its train step.

Exactly what is shimmed (each only where the real thing cannot be imported or does not apply):

- ``datasets`` (Hugging Face's, imported at module level by ``torchtitan.hf_datasets``, which its validator
  imports): a stand-in module whose loaders raise; :class:`TokenBatches` feeds the step instead
  (data loading).
- ``torch.utils.tensorboard`` (imported by ``torchtitan.components.metrics``; needs the tensorboard
  package and protobuf): a stand-in ``SummaryWriter`` that refuses to be built; TorchTitan's TensorBoard
  and W&B sinks stay off (logging).
- its tokenizer: :class:`NoTokenizer` (the step takes token ids; nothing is encoded) (data loading).
- on the CPU only (the suite's ``--tiny`` row): ``triton`` while TorchTitan's modules are imported (its
  expert-parallel token dispatch and two fused kernels for other models define Triton kernels at import;
  none runs for a dense Llama), and TorchTitan's device globals (it assumes an accelerator and defaults to
  ``"cuda"``) set to the CPU, with memory figures of zero (logging). On CUDA neither applies.

:func:`import_torchtitan` installs the stand-ins and returns TorchTitan's trainer module.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SHIMMED", "NoTokenizer", "TokenBatches", "import_torchtitan", "use_cpu"]

#: What the note of a TorchTitan row says was shimmed.
SHIMMED = (
    "shimmed (bench/peers/titan_shim.py): data loading (fixed token batches, no tokenizer, no datasets), "
    "logging (no tensorboard/wandb)"
)


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(
        "bench.peers.titan_shim: not available in the benchmark (data comes from TokenBatches)"
    )


def _stand_in(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return module


class _TritonName:
    """Any name under the stand-in ``triton``: callable (``triton.jit`` returns the function it decorates),
    subscriptable, with attributes; never run."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _TritonName(f"{self._name}.{attribute}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _TritonName(f"{self._name}()")

    def __getitem__(self, key: Any) -> Any:
        return self


def _module_getattr(name: str) -> Callable[[str], Any]:
    def getattr_(attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _TritonName(f"{name}.{attribute}")

    return getattr_


def import_torchtitan() -> types.ModuleType:
    """``torchtitan.trainer``, imported with the module docstring's stand-ins where the real ones are
    absent."""
    if "torchtitan.trainer" in sys.modules:
        return sys.modules["torchtitan.trainer"]
    import torch

    if importlib.util.find_spec("datasets") is None:
        _stand_in("datasets", Dataset=type("Dataset", (), {}), load_dataset=_refuse)
        _stand_in("datasets.distributed", split_dataset_by_node=_refuse)
    if importlib.util.find_spec("tensorboard") is None:
        _stand_in("torch.utils.tensorboard", SummaryWriter=_refuse)
    triton = importlib.util.find_spec("triton") is None
    if triton:
        # torch decides once whether Triton exists: let it decide (absent) before the stand-in appears.
        import torch._dynamo
        import torch._inductor
        import torch.distributed.pipelining
        import torch.nn.attention.flex_attention

        torch.compile(lambda x: x)  # imports the compile machinery TorchTitan's class bodies reach
        _stand_in("triton", __getattr__=_module_getattr("triton"))
        _stand_in("triton.language", __getattr__=_module_getattr("triton.language"))
        setattr(sys.modules["triton"], "language", sys.modules["triton.language"])  # noqa: B010
    try:
        import torchtitan.models.llama3
        import torchtitan.trainer
    finally:
        if triton:  # nothing later may find it
            del sys.modules["triton"], sys.modules["triton.language"]
    trainer: types.ModuleType = torchtitan.trainer
    return trainer


def use_cpu() -> None:
    """TorchTitan's device globals on the CPU (it has no CPU path; the suite's tiny row only)."""
    import torch
    import torchtitan.components.metrics
    import torchtitan.distributed.parallel_dims
    import torchtitan.distributed.utils
    import torchtitan.models.common.token_dispatcher
    import torchtitan.tools.utils

    cpu = types.SimpleNamespace(
        set_device=torch.cpu.set_device,
        current_device=torch.cpu.current_device,
        device_count=torch.cpu.device_count,
        synchronize=torch.cpu.synchronize,
        get_device_name=lambda device=None: "cpu",
        get_device_properties=lambda device=None: types.SimpleNamespace(total_memory=1),
        reset_peak_memory_stats=lambda *args: None,
        empty_cache=lambda: None,
        memory_stats=lambda device=None: {},
    )
    for module in (
        torchtitan.tools.utils,
        torchtitan.components.metrics,
        torchtitan.models.common.token_dispatcher,
        torchtitan.distributed.parallel_dims,
        torchtitan.distributed.utils,
    ):
        if hasattr(module, "device_type"):
            module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = cpu


def _classes() -> tuple[type, type]:
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.components.tokenizer import BaseTokenizer

    return BaseTokenizer, BaseDataLoader


import_torchtitan()
_BaseTokenizer, _BaseDataLoader = _classes()


class NoTokenizer(_BaseTokenizer):  # type: ignore[misc,valid-type]
    """TorchTitan's tokenizer slot, holding only the vocabulary size (the step takes token ids)."""

    @dataclass(kw_only=True, slots=True)
    class Config(_BaseTokenizer.Config):  # type: ignore[misc,name-defined]
        vocab_size: int = 0

    def __init__(self, config: Config, **kwargs: Any) -> None:
        super().__init__()
        self.vocab_size = config.vocab_size

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        return _refuse()  # type: ignore[no-any-return]

    def decode(self, *args: Any, **kwargs: Any) -> str:
        return _refuse()  # type: ignore[no-any-return]

    def get_vocab_size(self) -> int:
        return self.vocab_size


class TokenBatches(_BaseDataLoader):  # type: ignore[misc,valid-type]
    """TorchTitan's data loader slot: the same ``(batch, seq + 1)`` token ids every step, as
    ``({"input": ids[:, :-1]}, ids[:, 1:])`` (its loaders' form): ``batch x seq`` tokens a step."""

    @dataclass(kw_only=True, slots=True)
    class Config(_BaseDataLoader.Config):  # type: ignore[misc,name-defined]
        tokens: Any = field(default=None, repr=False)

    def __init__(self, config: Config, **kwargs: Any) -> None:
        self.tokens = config.tokens

    def __iter__(self) -> Iterator[tuple[dict[str, Any], Any]]:
        while True:
            yield {"input": self.tokens[:, :-1]}, self.tokens[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass
