"""What a parameter's name says, written without torch: whether it is an adapter, and its seed.

Below every user of these facts: the weight loader and initialiser beside this module skip the adapters
(no pretrained checkpoint holds them, the model's ``init_fn`` does not draw them), and the ``peft``
component, which adds them, imports their names from here rather than the models importing ``peft``.
"""

import re

__all__ = ["LORA_A", "LORA_B", "is_adapter", "parameter_seed"]

#: The names of a LoRA adapter's two matrices as parameters of the layer they adapt (``<layer>.lora_A``
#: is ``rank x in``, ``<layer>.lora_B`` is ``out x rank``), as the ``peft`` library names them.
LORA_A = "lora_A"
LORA_B = "lora_B"
#: Wrappers (activation checkpointing, compile) add prefixes inside a name, never after its last part.
_ADAPTER = re.compile(rf"(^|\.)({LORA_A}|{LORA_B})$")


def is_adapter(name: str) -> bool:
    """Whether parameter ``name`` is an adapter matrix (``<layer>.lora_A`` / ``<layer>.lora_B``)."""
    return _ADAPTER.search(name) is not None


def parameter_seed(seed: int, name: str) -> int:
    """The seed of parameter ``name``'s generator: a stable 63-bit hash of ``(seed, name)``.

    Every layout draws a parameter's full tensor from it and keeps its shard, so the same seed gives the
    same weights (and adapters) on one process, under FSDP2 or under tensor parallelism.
    """
    import hashlib  # here, not at import: OpenSSL's binding costs every --dry-run 2.5 ms it never uses

    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)
