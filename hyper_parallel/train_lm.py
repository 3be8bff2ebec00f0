"""Launch language-model training: ``python -m hyper_parallel.train_lm --config-file FILE [--a.b VALUE ...]``.

The config is resolved and checked in full before anything is built; see ``hyper_parallel.launch``.
"""

from hyper_parallel._cli import collection_paused, run

with collection_paused():  # the modules loading make what the process keeps: nothing to collect yet
    from hyper_parallel.launch import main

__all__ = ["main"]

if __name__ == "__main__":
    run(lambda: main(prog="train_lm"))
