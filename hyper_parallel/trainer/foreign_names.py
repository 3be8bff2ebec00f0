"""The keys users bring from other trainers' configs, and what a ``TrainerConfig`` calls each: data only.

A key of transformers' ``TrainingArguments``, TRL, Axolotl or TorchTitan is still an unknown field here (a
config has one spelling of each setting, so these are hints, never aliases), but its message says what
replaces it: ``unknown root field 'learning_rate'; did you mean 'optimizer.lr'?``. The table is handed to
the config layer with the root (``register_root(..., foreign_names=)``), which names no field itself.
Only keys that no group has are listed, and every field named exists (a test walks the table).
"""

from collections.abc import Mapping

__all__ = ["FOREIGN_NAMES"]

_LORA = "with peft._target_: hyper_parallel.components.peft.LoRA.Config"
_WEIGHTS = (
    "a local directory of safetensors weights, with model._target_: "
    "hyper_parallel.models.llama3.create_model_spec or another native model; "
    "any transformers causal LM, by folder or Hub id: "
    "hyper_parallel.models.hf.create_model_spec's path"
)
_EPOCHS = "whole passes over the data, with training.max_steps: null (one of the two gives the run's length)"

#: Another tool's key -> (the field that replaces it, ``""`` where none does; what to know, or ``""``).
FOREIGN_NAMES: Mapping[str, tuple[str, str]] = {
    # transformers' TrainingArguments (and TRL's SFTConfig, which extends it)
    "learning_rate": ("optimizer.lr", ""),
    "num_train_epochs": ("training.epochs", _EPOCHS),
    "gradient_accumulation_steps": (
        "",
        "it is derived: training.global_batch_size / (training.micro_batch_size x parallelism.dp_replicate "
        "x parallelism.dp_shard)",
    ),
    "per_device_train_batch_size": ("training.micro_batch_size", ""),
    "per_device_eval_batch_size": ("validator.micro_batch_size", ""),
    "warmup_ratio": ("lr_scheduler.warmup_steps", "a number of steps, not a fraction of training.max_steps"),
    "lr_scheduler_type": ("lr_scheduler.decay_type", ""),
    "adam_beta1": ("optimizer.betas", "both betas as one pair"),
    "adam_beta2": ("optimizer.betas", "both betas as one pair"),
    "adam_epsilon": ("optimizer.eps", ""),
    "optim": ("", "the optimizer is the class optimizer._target_ names"),
    "bf16": ("training.mixed_precision_param", "'bfloat16', the default"),
    "fp16": ("training.mixed_precision_param", "'float16'"),
    "gradient_checkpointing": ("activation_checkpoint.mode", "'full' or 'selective'"),
    "output_dir": ("checkpoint.folder", ""),
    "save_steps": ("checkpoint.interval", ""),
    "save_total_limit": ("checkpoint.keep_latest_k", ""),
    "logging_steps": ("metrics.log_freq", ""),
    "eval_steps": ("validator.freq", ""),
    "dataloader_num_workers": ("dataloader.num_workers", ""),
    "label_smoothing_factor": ("loss.label_smoothing", ""),
    "torch_compile": ("compile.enable", ""),
    "max_seq_length": ("training.seq_len", ""),
    "max_length": ("training.seq_len", ""),
    "model_name_or_path": ("model.weights_path", _WEIGHTS),
    "tokenizer_name": ("tokenizer.path", ""),
    # PEFT's LoraConfig, as Axolotl names it
    "lora_r": ("peft.rank", _LORA),
    "lora_alpha": ("peft.alpha", _LORA),
    "lora_dropout": ("peft.dropout", _LORA),
    "lora_target_modules": ("peft.targets", _LORA),
    # Axolotl
    "sequence_len": ("training.seq_len", ""),
    "num_epochs": ("training.epochs", _EPOCHS),
    "base_model": ("model.weights_path", _WEIGHTS),
    "cosine_min_lr_ratio": ("lr_scheduler.min_lr_factor", ""),
    # TorchTitan
    "local_batch_size": ("training.micro_batch_size", ""),
    "max_norm": ("training.max_grad_norm", ""),
    "data_parallel_replicate_degree": ("parallelism.dp_replicate", ""),
    "data_parallel_shard_degree": ("parallelism.dp_shard", ""),
    "tensor_parallel_degree": ("parallelism.tp", ""),
    "pipeline_parallel_degree": ("parallelism.pp", ""),
    "context_parallel_degree": ("parallelism.cp", ""),
    "expert_parallel_degree": ("parallelism.ep", ""),
}
