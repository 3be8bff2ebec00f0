"""Benchmarks and device checks, run from the repository root with ``python -m bench [WHAT]``.

- ``python -m bench`` (``bench.run``, with ``bench.peers`` and ``bench.overrides``): resolve, override,
  dump and start-up cost of the config layer, side by side with Hydra/OmegaConf and pydantic v2 (``pip
  install -e '.[bench]'``; ``--quick`` for a smoke run, ``--json PATH``);
- ``python -m bench models``: our model modules against transformers' (same weights), speed and memory;
- ``python -m bench train``: the trainer's throughput against a minimal hand-written PyTorch loop;
- ``python -m bench lora``: LoRA and QLoRA steps against a full fine-tuning step, and their memory;
- ``python -m bench loss``: the fused, chunked cross entropy against the whole-logits loss, peak memory and
  time of the projection plus the loss;
- ``python -m bench data``: prepared data's memory, start-up, prepare throughput and loader share of a step;
- ``python -m bench gpu`` (``bench.gpu``): training speed, MFU and memory on one accelerator, and
  ``python -m bench gpu --check`` (``bench.gpu_check``): every device check in one call; both take the
  model shapes of ``bench.model_shapes``;
- ``python -m bench.attention_probe``: document-masked attention kernels on CUDA side by side.

The package is never imported by ``hyper_parallel``; the test suite runs the CPU smoke modes of
``bench gpu`` so they cannot rot.
"""
