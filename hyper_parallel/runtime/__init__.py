"""PyTorch implementations behind the component Configs' ``build()`` methods.

Nothing here is imported while a config is resolved: each ``build()`` imports its module from this package
inside its body, and these modules import torch (and tokenizers) at their top. Keeping them out of
``hyper_parallel.components`` keeps that package attrs-only.
"""
