"""A torchrun worker for ``tests/trainer/test_startup_stall.py``: rank 1 stalls before it joins the
process group (it sleeps until torchrun stops it), every other rank runs ``train_lm`` with the arguments."""

from __future__ import annotations

import os
import sys
import time

if __name__ == "__main__":
    if os.environ.get("RANK") == "1":
        time.sleep(600)  # stopped by torchrun once rank 0 has failed
        sys.exit(0)
    from hyper_parallel._cli import run
    from hyper_parallel.launch import main

    run(lambda: main(sys.argv[1:], prog="train_lm"))
