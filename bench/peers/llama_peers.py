"""Each implementation's training step on the Llama 3.2-1B shape, built for :mod:`bench.peers.harness`.

- ``ours``: our trainer (``LLMTrainer``) on ``configs/llama3_2_1b_gpu.yaml``, its own ``train_step`` (the
  fused, chunked loss; FSDP2; ``compile.enable`` for the compiled row).
- ``ours_hf``: the same trainer and config with the model section replaced by the transformers path
  (``model: {_target_: hyper_parallel.models.hf.create_model_spec, path: FOLDER, init: random}``), FOLDER a
  ``config.json`` of transformers' ``LlamaForCausalLM`` at the same shape (:func:`write_hf_folder`); its
  own ``train_step`` (the whole logits and the config's loss: the fused loss is the native models').
- ``hf_loop``: the loop a transformers user writes around the same folder's model, doing what the trainer
  does at this world size: on one device the trainer applies no FSDP2 (it shards across ranks only) and
  computes under ``torch.autocast`` to ``training.mixed_precision_param`` over float32 parameters, each
  decoder layer compiled with the config's ``compile`` settings for the compiled row (the trainer
  compiles its loss too, ``compile.components``; transformers' loss stays as its users run it); the config's
  optimizer (:meth:`build`, the same parameter groups), schedule, clipping and batches (its data loader);
  a step is ``model(input_ids, labels=...)`` (transformers' own loss), backward, clipping, the optimizer's
  and the schedule's step. ``ours_hf`` over ``hf_loop`` is the trainer's cost over a bare loop (issue 45
  item 7: at least 0.97x); ``ours`` over ``ours_hf`` is the native model's lead on the same shape.
- ``transformers``: transformers' ``LlamaForCausalLM`` of the same shape, embeddings tied
  (:func:`transformers_llama`), under FSDP2 as ``bench gpu`` prepares it (each decoder layer compiled for
  the compiled row); a step is ``model(input_ids, labels=...)``, backward, clipping, AdamW.
- ``liger``: the same with Liger's kernels (``apply_liger_kernel_to_llama``: RMSNorm, SwiGLU, RoPE and the
  fused linear cross entropy) where ``liger_kernel`` is importable on CUDA.
- ``torchtitan``: TorchTitan's own ``Trainer`` (its Llama 3 model at our shape with tied embeddings, its
  ``parallelize_llama``, optimizer, chunked loss and ``train_step``), with only data loading and logging
  shimmed (:mod:`bench.peers.titan_shim`). Its attention is its ``ScaledDotProductAttention`` (causal, as
  ours on these one-document rows); CUDA graphs off (ours has none).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.peers.harness import Built, Setting

__all__ = [
    "build",
    "our_config",
    "titan_model",
    "transformers_llama",
    "transformers_llama_config",
    "unavailable",
    "write_hf_folder",
]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "llama3_2_1b_gpu.yaml"
#: AdamW's settings in every row (our GPU config's).
LR, WEIGHT_DECAY, BETAS = 3e-4, 0.1, (0.9, 0.95)
MAX_NORM = 1.0


def our_config(setting: Setting, hf_folder: Path | None = None) -> Any:
    """Our GPU config at the setting's shape, saving and logging nothing (tiny: the check's tiny shape);
    with ``hf_folder`` (:func:`write_hf_folder`, which holds that shape), its model section is the
    transformers path over that folder's ``config.json``, random init, everything else the same."""
    from bench.gpu_check import TINY_OVERRIDES
    from bench.hf_path import hf_model_text
    from bench.train import _QUIET  # quiet, file-free runs: no metrics files, checkpoints, profiler
    from hyper_parallel.config import ConfigWarning, load_config

    overrides: dict[str, Any] = {
        **_QUIET,
        "compile.enable": str(setting.compiled).lower(),
        "training.max_steps": str(setting.warmup + setting.steps),
        "training.seq_len": str(setting.seq),
        "training.micro_batch_size": str(setting.batch),
        "training.global_batch_size": str(setting.batch),
    }
    text = None if hf_folder is None else hf_model_text(CONFIG, hf_folder, init="random")
    if hf_folder is None and setting.tiny:
        overrides.update(
            {f"model.overrides.{k}": str(v) for k, v in TINY_OVERRIDES["llama3_2_1b_gpu"].items()}
        )
    if setting.tiny:
        overrides.update({"training.mixed_precision_param": "float32", "lr_scheduler.warmup_steps": "1"})
    with warnings.catch_warnings():  # "no metrics would be logged": a timing run logs nothing, on purpose
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(CONFIG, overrides, text=text)


def write_hf_folder(setting: Setting, folder: Path) -> None:
    """``folder/config.json``: transformers' ``LlamaForCausalLM`` at our GPU config's shape for the setting
    (tied embeddings; no weights: the transformers path draws them, ``init: random``)."""
    transformers_llama_config(our_config(setting).model.args).save_pretrained(folder)


def unavailable(peer: str, setting: Setting, cuda: bool) -> str | None:
    """Why ``peer`` cannot run here (None: it can)."""
    if setting.compiled and not cuda:
        return "compiled rows run on CUDA only (compiling takes longer than a tiny run)"
    if peer == "liger":
        if importlib.util.find_spec("liger_kernel") is None:
            return "liger-kernel is not installed (carry its wheel: bench/peers/README.md)"
        if not cuda:
            return "Liger's kernels are Triton kernels: CUDA only"
    if peer == "torchtitan" and importlib.util.find_spec("torchtitan") is None:
        return "torchtitan is not installed (bench/peers/requirements.txt; bench/peers/README.md)"
    return None


def build(peer: str, setting: Setting, device: Any) -> Built:
    """``peer``'s step at the setting's shape on ``device``."""
    builders = {"ours": _ours, "ours_hf": _ours_hf, "hf_loop": _hf_loop, "transformers": _transformers,
                "liger": _liger, "torchtitan": _torchtitan}  # fmt: skip
    return builders[peer](setting, device)


def _tokens(setting: Setting, vocab_size: int, extra: int = 0) -> Any:
    import torch

    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab_size, (setting.batch, setting.seq + extra), generator=generator)


def _ours(setting: Setting, device: Any) -> Built:
    from bench.peers.harness import Built
    from hyper_parallel.trainer import LLMTrainer

    trainer = LLMTrainer(our_config(setting), stream=io.StringIO())
    notes = ["our trainer's train_step (fused chunked loss)"]
    return Built(
        trainer.train_step, setting.batch * setting.seq, trainer.parameter_count(), notes, trainer.close
    )


def _ours_hf(setting: Setting, device: Any) -> Built:
    from bench.peers.harness import Built
    from hyper_parallel.trainer import LLMTrainer

    folder = tempfile.TemporaryDirectory(prefix="bench-hf-")
    write_hf_folder(setting, Path(folder.name))
    trainer = LLMTrainer(our_config(setting, Path(folder.name)), stream=io.StringIO())

    def close() -> None:
        trainer.close()
        folder.cleanup()

    notes = ["our trainer's train_step on the transformers path (LlamaForCausalLM, tied, init: random)"]
    return Built(trainer.train_step, setting.batch * setting.seq, trainer.parameter_count(), notes, close)


def _hf_loop(setting: Setting, device: Any) -> Built:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from bench.hf_path import bare_loop
    from bench.peers.harness import Built

    folder = tempfile.TemporaryDirectory(prefix="bench-hf-")
    write_hf_folder(setting, Path(folder.name))
    cfg = our_config(setting, Path(folder.name))
    torch.manual_seed(cfg.run_seed())
    config = AutoConfig.from_pretrained(folder.name)
    model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
        config, dtype=torch.float32, attn_implementation=cfg.model.args.attn_implementation
    )
    parameters = sum(p.numel() for p in model.parameters())
    model = model.to(device).train()
    if setting.compiled:
        for layer in model.model.layers:
            layer.compile(backend=cfg.compile.backend, mode=cfg.compile.mode, fullgraph=cfg.compile.fullgraph)
    step = bare_loop(cfg, model, device)
    dtype = cfg.training.mixed_precision_param
    compute = "float32" if dtype == "float32" else f"autocast to {dtype}"
    notes = [
        "a bare loop over the same LlamaForCausalLM folder: the trainer's one-device wrapping (no FSDP2, "
        f"{compute} over float32 parameters), optimizer, schedule, clipping and batches; transformers' loss"
    ]
    return Built(step, setting.batch * setting.seq, parameters, notes, folder.cleanup)


def transformers_llama_config(args: Any) -> Any:
    """transformers' ``LlamaConfig`` of our Llama 3 ``args`` (embeddings tied as ours are): the
    ``config.json`` our export writes for them (:meth:`Llama3StateDictAdapter.hf_config`), one mapping."""
    import transformers

    from hyper_parallel.models.llama3._runtime import Llama3StateDictAdapter

    return transformers.LlamaConfig.from_dict(Llama3StateDictAdapter(args).hf_config())


def transformers_llama(args: Any) -> Any:
    """transformers' ``LlamaForCausalLM`` of our Llama 3 ``args`` (embeddings tied as ours are)."""
    import transformers

    return transformers.LlamaForCausalLM(transformers_llama_config(args))


def _transformers(setting: Setting, device: Any, liger: bool = False) -> Built:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from bench.gpu import _prepare, one_rank_group
    from bench.peers.harness import Built

    if liger:
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama()  # patches transformers' Llama classes: before the model is built
    args = our_config(setting).model.args
    torch.manual_seed(0)
    model = transformers_llama(args)
    parameters = sum(p.numel() for p in model.parameters())
    group = contextlib.ExitStack()
    group.enter_context(one_rank_group(device))
    model = _prepare(model, device, init_device_mesh(device.type, (1,)), setting.compiled)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, foreach=True
    )
    tokens = _tokens(setting, args.vocab_size).to(device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=tokens, labels=tokens).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM, foreach=True)
        optimizer.step()

    notes = ["transformers' LlamaForCausalLM, tied" + (", Liger's kernels" if liger else "")]
    return Built(step, setting.batch * setting.seq, parameters, notes, group.close)


def _liger(setting: Setting, device: Any) -> Built:
    return _transformers(setting, device, liger=True)


def titan_model(args: Any, attention: Any) -> Any:
    """TorchTitan's ``Llama3Model.Config`` of our Llama 3 ``args`` (tied as ours), its blocks built by its
    own ``make_gqa_config``/``make_ffn_config`` (fused QKV, as its flavors) with ``attention`` inside."""
    from functools import partial

    from torch import nn
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
    from torchtitan.models.llama3 import Llama3Model
    from torchtitan.models.llama3.model import Llama3TransformerBlock

    normal = {"weight": partial(nn.init.normal_, std=0.02), "bias": nn.init.zeros_}
    ones = {"weight": nn.init.ones_}
    scaling = args.rope_scaling
    rope = ComplexRoPE.Config(
        dim=args.dim // args.n_heads,
        max_seq_len=args.max_seq_len,
        theta=args.rope_theta,
        **(
            {}
            if scaling is None
            else {
                "scaling": "llama",
                "scaling_factor": scaling.factor,
                "low_freq_factor": scaling.low_freq_factor,
                "high_freq_factor": scaling.high_freq_factor,
                "original_max_position_embeddings": scaling.original_max_position_embeddings,
            }
        ),
    )

    def block() -> Any:
        return Llama3TransformerBlock.Config(
            attention_norm=RMSNorm.Config(normalized_shape=args.dim, eps=args.norm_eps, param_init=ones),
            ffn_norm=RMSNorm.Config(normalized_shape=args.dim, eps=args.norm_eps, param_init=ones),
            attention=make_gqa_config(
                dim=args.dim,
                n_heads=args.n_heads,
                n_kv_heads=args.n_kv_heads,
                wqkv_param_init=normal,
                wo_param_init=normal,
                inner_attention=attention,
                fuse_qkv=True,
                rope=rope,
            ),
            feed_forward=make_ffn_config(
                dim=args.dim, hidden_dim=args.ffn_hidden_dim, w1_param_init=normal, w2w3_param_init=normal
            ),
        )

    return Llama3Model.Config(
        dim=args.dim,
        vocab_size=args.vocab_size,
        enable_weight_tying=args.tie_word_embeddings,
        tok_embeddings=Embedding.Config(
            num_embeddings=args.vocab_size, embedding_dim=args.dim, param_init={"weight": normal["weight"]}
        ),
        norm=RMSNorm.Config(normalized_shape=args.dim, eps=args.norm_eps, param_init=ones),
        lm_head=Linear.Config(in_features=args.dim, out_features=args.vocab_size, param_init=normal),
        layers=[block() for _ in range(args.n_layers)],
    )


def _torchtitan(setting: Setting, device: Any) -> Built:
    import os

    from bench.gpu import one_rank_group
    from bench.peers import titan_shim
    from bench.peers.harness import Built

    trainer_module = titan_shim.import_torchtitan()
    if device.type == "cpu":
        titan_shim.use_cpu()
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
    from torchtitan.components.validate import Validator
    from torchtitan.config import CompileConfig, TrainingConfig
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import parallelize_llama
    from torchtitan.protocols.model_spec import ModelSpec

    args = our_config(setting).model.args
    os.environ.setdefault("LOCAL_RANK", "0")
    group = contextlib.ExitStack()
    group.enter_context(one_rank_group(device))  # as its launcher would start one rank
    spec = ModelSpec(
        name="llama3",
        flavor="bench",
        model=titan_model(args, ScaledDotProductAttention.Config()),
        parallelize_fn=parallelize_llama,
        pipelining_fn=None,
        post_optimizer_build_fn=None,
        state_dict_adapter=None,
    )
    folder = tempfile.TemporaryDirectory(prefix="torchtitan-")
    config = trainer_module.Trainer.Config(
        model_spec=spec,
        dump_folder=folder.name,
        tokenizer=titan_shim.NoTokenizer.Config(vocab_size=args.vocab_size),
        dataloader=titan_shim.TokenBatches.Config(tokens=_tokens(setting, args.vocab_size, extra=1)),
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=args.vocab_size)),
        optimizer=default_adamw(lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY),
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=1 if setting.tiny else 5),
        training=TrainingConfig(
            local_batch_size=setting.batch,
            seq_len=setting.seq,
            steps=setting.warmup + setting.steps,
            max_norm=MAX_NORM,
            mixed_precision_param="bfloat16" if device.type == "cuda" else "float32",
            disable_cuda_graphs=True,
        ),
        compile=CompileConfig(enable=setting.compiled),
        activation_checkpoint=None,
        metrics=MetricsProcessor.Config(log_freq=10**9),
        checkpoint=CheckpointManager.Config(enable=False),
        validator=Validator.Config(enable=False),
    )
    trainer = trainer_module.Trainer(config)
    batches = trainer.batch_generator(trainer.dataloader)
    parameters = sum(p.numel() for p in trainer.model_parts[0].parameters())

    def step() -> None:  # what its train() does around each train_step, saving and validating nothing
        trainer.step += 1
        trainer.gc_handler.run(trainer.step)
        trainer.train_step(batches)

    def close() -> None:
        trainer.close()
        folder.cleanup()
        group.close()

    notes = [
        f"TorchTitan {_version('torchtitan')}'s Trainer.train_step, its Llama3Model tied, parallelize_llama "
        "(FSDP2), AdamW, chunked loss; SDPA attention; CUDA graphs off",
        titan_shim.SHIMMED,
    ]
    return Built(step, setting.batch * setting.seq, parameters, notes, close)


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)
