"""The shipped ``configs/qwen3_5_full.yaml`` expressed with each peer library, plus our own entry points.

Every peer module has the same surface: ``resolve(raw)`` turns a parsed document (a mapping of root groups,
each with ``_target_``) into a validated root object, ``load(path)`` reads a file and resolves it, and
``python -m bench.peers.<name> FILE`` does one ``load`` in a fresh process (the cold measurement). These
modules import nothing from each other so a cold run pays for one library only.
"""
