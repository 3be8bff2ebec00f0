"""Performance benchmark of the config layer, side by side with Hydra/OmegaConf and pydantic v2.

Run from the repository root after ``pip install -e '.[bench]'``::

    python -m bench            # full run, about a minute on 2 cores
    python -m bench --quick    # smoke run, a few seconds
    python -m bench --json results.json

See :mod:`bench.run` for what each figure means. Nothing here is imported by the package or its tests.
"""
