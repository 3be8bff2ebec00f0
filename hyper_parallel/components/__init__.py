"""Training components: each kind is a package whose ``Config`` classes are its ``__init__`` module.

``components/<kind>/__init__.py`` holds the kind's torch-free Configs (each a class with a nested frozen
attrs ``Config`` deriving from ``hyper_parallel.config.base.ConfigBase``); it imports attrs and nothing
heavier, so resolving a config never imports torch. The runtime each ``build()`` creates lives in private
modules beside it (``_runtime.py``, or one module per job for the data loader and the checkpoint), imported
inside ``build()`` only; being private, they are never read as target modules.
"""
