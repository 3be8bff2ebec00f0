"""Launch vision-language training: ``python -m hyper_parallel.train_vl --config-file FILE [--a.b V ...]``.

Same command line and checks as ``train_lm``; the VL trainer receives the resolved config.
"""

from hyper_parallel._cli import collection_paused, run

with collection_paused():  # the modules loading make what the process keeps: nothing to collect yet
    from hyper_parallel.launch import main

__all__ = ["main"]

if __name__ == "__main__":
    run(lambda: main(prog="train_vl"))
