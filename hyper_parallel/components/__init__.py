"""Training components: each kind is a package whose ``Config`` classes are its ``__init__`` module.

``components/<kind>/__init__.py`` holds the kind's torch-free Configs (each a class with a nested frozen
attrs ``Config`` deriving from ``hyper_parallel.config_base.ConfigBase``); it imports attrs and nothing
heavier, so resolving a config never imports torch. The runtime each ``build()`` creates lives in private
modules beside it (``_runtime.py``, or one module per job for the data loader and the checkpoint), imported
inside ``build()`` only; being private, they are never read as target modules.

Each kind's base class (``Loss``, ``Optimizer``, ``Checkpoint``, ...) is a namespace, not an object the
trainer builds: it gives the Config its dotted name (``Loss.Config``: the root field's type and what a
``_target_`` names) and lets an implementation subclass both, ``Impl(Loss)`` with
``Impl.Config(Loss.Config)``. Its docstring says only which root field it types.
"""
