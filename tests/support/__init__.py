"""What the tests share, so that no test module imports another.

- ``processes``: the one way tests start other processes: ``torchrun`` (one agent or several "nodes") and
  in-process ``spawn`` groups, all meeting without a port picked in advance (no bind-and-close race).
- ``trainer`` and ``trainer_worker``: tiny versions of the shipped debug configs, the layout grid and the
  worker that torchrun runs for the multi-process trainer tests.
- ``components``: a tiny tokenizer, corpus and language models for the component tests.
- ``parallel_models``: the tiny models and layouts of the two-process ``parallelize`` tests.
- ``llama3_reference``, ``qwen3_5_reference``: tiny model arguments and the transformers models they match.
- ``fake_targets``, ``rule_targets``, ``import_recorder``: modules that tests name as ``_target_`` (their
  dotted names appear in test documents, so they keep their names); ``rule_converter`` resolves the
  ``rule_targets`` root.
"""

from pathlib import Path

__all__ = ["ROOT"]

#: The repository root (the shipped ``configs/`` and the working directory the entry points expect).
ROOT = Path(__file__).resolve().parents[2]
