"""Prepared data: ``python -m hyper_parallel.data prepare`` tokenizes text once into memory-mapped shards.

Torch-free, so preparing runs on any machine with numpy and the tokenizer libraries. ``shards`` is the
format (written here, read by the data loader's ``tokenized`` source), ``prepare`` the tokenizing,
``chat`` the rendering of chat records, ``__main__`` the command line.
"""

__all__: list[str] = []
