"""Peers of the project, two kinds.

The config layer's: the shipped ``configs/qwen3_5_full.yaml`` expressed with each peer library, plus our own
entry points (``ours``, ``hydra_peer``, ``pydantic_peer``). Every such module has the same surface:
``resolve(raw)`` turns a parsed document (a mapping of root groups, each with ``_target_``) into a validated
root object, ``load(path)`` reads a file and resolves it, and ``python -m bench.peers.<name> FILE`` does one
``load`` in a fresh process (the cold measurement). These modules import nothing from each other so a cold
run pays for one library only.

The training step's: ``harness`` times our trainer, transformers, Liger and TorchTitan with one loop
(``llama_peers`` builds each step; ``titan_shim`` replaces TorchTitan's data loading and logging).
"""
