"""Launch vision-language training: ``python -m hyper_parallel.train_vl --config-file FILE [--a.b V ...]``.

Same command line and checks as ``train_lm``; the VL trainer receives the resolved config.
"""

from hyper_parallel.launch import exit_process, main

__all__ = ["main"]

if __name__ == "__main__":
    exit_process(main(prog="train_vl"))
