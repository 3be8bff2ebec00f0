# ruff: noqa: E501  (a table of field paths and test ids reads best one entry per line)
"""Every field of ``TrainerConfig`` does something: a test observes the runtime reading it, or it is refused.

``WIRED`` maps each leaf field path (for every shipped implementation of each root group) to the test that
observes the runtime honouring it; ``REFUSED`` maps the fields this release cannot honour to a value the
resolver must refuse with "not supported yet". A new field fails ``test_every_field_is_wired_or_refused``
until it is listed in one of them, with a test that exists.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import get_type_hints

import attrs
import pytest

from hyper_parallel.config import ConfigError
from hyper_parallel.models.spec import ModelArgs
from hyper_parallel.trainer.config import TrainerConfig
from tests.support.trainer import tiny_config

TESTS = Path(__file__).resolve().parents[1]

WIRED: dict[str, str] = {
    # model
    "model.name": "trainer/test_parallel.py::test_train_lm_under_torchrun_trains_and_only_rank_zero_prints",
    "model.flavor": "trainer/test_parallel.py::test_train_lm_under_torchrun_trains_and_only_rank_zero_prints",
    "model.args": "models/test_llama3.py::test_from_hf_logits_match_transformers",
    "model.weights_path": (
        "trainer/test_trainer.py::test_training_starts_from_save_pretrained_weights_with_the_loss_transformers_computes"
    ),
    "model.build_model_fn": "trainer/test_trainer.py::test_trainer_builds_from_the_config_alone_and_trains_every_step",
    "model.parallelize_fn": "trainer/test_parallel.py::test_two_processes_match_one_and_really_shard",
    "model.state_dict_adapter": (
        "trainer/test_trainer.py::test_training_starts_from_save_pretrained_weights_with_the_loss_transformers_computes"
    ),
    "model.init_fn": "trainer/test_trainer.py::test_init_device_cpu_and_meta_start_from_the_same_weights",
    "model.recipe": "config/test_target_switch.py::test_a_copied_config_can_be_overridden_and_dumped",
    # tokenizer
    "tokenizer.path": "components/test_tokenizer.py::test_path_may_name_the_file",
    "tokenizer.add_bos": "components/test_tokenizer.py::test_add_bos_and_add_eos_flags",
    "tokenizer.add_eos": "components/test_tokenizer.py::test_add_bos_and_add_eos_flags",
    "tokenizer.chat_template": "components/test_chat_templates.py::test_each_preset_trains_on_the_answers_and_the_token_ending_them",
    "tokenizer.bos_token": "components/test_tokenizer.py::test_config_tokens_override_and_pad_falls_back_to_eos",
    "tokenizer.eos_token": "components/test_tokenizer.py::test_config_tokens_override_and_pad_falls_back_to_eos",
    "tokenizer.pad_token": "components/test_tokenizer.py::test_config_tokens_override_and_pad_falls_back_to_eos",
    "tokenizer.padding_side": "components/test_tokenizer.py::test_pad_follows_padding_side",
    "tokenizer.use_fast": "trainer/test_data_config_checks.py::test_settings_the_runtime_would_not_honour_are_refused",
    "tokenizer.model_max_length": "components/test_tokenizer.py::test_model_max_length",
    # dataloader
    "dataloader.num_workers": "components/test_dataloader.py::test_worker_and_memory_options_reach_the_torch_loader",
    "dataloader.pin_memory": "components/test_dataloader.py::test_worker_and_memory_options_reach_the_torch_loader",
    "dataloader.prefetch_factor": (
        "components/test_dataloader.py::test_worker_and_memory_options_reach_the_torch_loader"
    ),
    "dataloader.persistent_workers": (
        "components/test_dataloader.py::test_worker_and_memory_options_reach_the_torch_loader"
    ),
    "dataloader.shuffle": "components/test_dataloader.py::test_shuffle_is_seeded_and_changes_every_epoch",
    "dataloader.drop_last": "components/test_dataloader.py::test_max_samples_and_drop_last",
    "dataloader.dataset.source": "components/test_dataloader.py::test_synthetic_source",
    "dataloader.dataset.paths": "components/test_dataloader.py::test_text_source_reads_directories_one_document_per_file",
    "dataloader.dataset.text_field": (
        "components/test_dataloader.py::test_packed_batches_are_the_document_stream_cut_into_windows"
    ),
    "dataloader.dataset.seed": "components/test_dataloader.py::test_shuffle_is_seeded_and_changes_every_epoch",
    "dataloader.dataset.pack_sequences": (
        "components/test_dataloader.py::test_unpacked_documents_are_padded_with_ignored_labels"
    ),
    "dataloader.dataset.document_masking": "trainer/test_trainer.py::test_packed_documents_are_kept_apart_unless_document_masking_is_off",
    "dataloader.dataset.max_samples": "components/test_dataloader.py::test_max_samples_and_drop_last",
    "dataloader.dataset.synthetic_num_samples": "components/test_dataloader.py::test_synthetic_source",
    "dataloader.dataset.image_min_pixels": "trainer/test_image_chat.py::test_the_pixel_bounds_set_the_image_size",
    "dataloader.dataset.image_max_pixels": "trainer/test_image_chat.py::test_the_pixel_bounds_set_the_image_size",
    "dataloader.dataset.weights": "components/test_data_tokenized.py::test_a_mixture_blends_sources_by_weight_in_every_window",
    "dataloader.dataset.holdout_fraction": (
        "components/test_data_tokenized.py::test_a_held_out_fraction_never_shares_a_document_with_training"
    ),
    "dataloader.dataset.split": "components/test_data_tokenized.py::test_a_held_out_fraction_never_shares_a_document_with_training",
    "dataloader.dataset.overlong": "components/test_data_packing.py::test_the_loader_refuses_drops_or_cuts_an_overlong_conversation",
    "dataloader.dataset.train_on": "components/test_data_packing.py::test_the_chat_source_refuses_records_without_a_label_and_drops_them_when_told",
    "dataloader.dataset.drop_unlabeled": "components/test_data_packing.py::test_the_chat_source_refuses_records_without_a_label_and_drops_them_when_told",
    # optimizer
    "optimizer.lr": "components/test_optimizer.py::test_adamw_honours_every_field",
    "optimizer.weight_decay": "components/test_optimizer.py::test_adamw_step_decays_only_the_decay_group",
    "optimizer.no_decay_bias": "components/test_optimizer.py::test_flags_switch_each_exemption",
    "optimizer.no_decay_norm": "components/test_optimizer.py::test_flags_switch_each_exemption",
    "optimizer.no_decay_embedding": "components/test_optimizer.py::test_flags_switch_each_exemption",
    "optimizer.no_decay_names": "components/test_optimizer.py::test_flags_switch_each_exemption",
    "optimizer.betas": "components/test_optimizer.py::test_adamw_honours_every_field",
    "optimizer.eps": "components/test_optimizer.py::test_adamw_honours_every_field",
    "optimizer.amsgrad": "components/test_optimizer.py::test_adamw_honours_every_field",
    "optimizer.implementation": "components/test_optimizer.py::test_adamw_honours_every_field",
    "optimizer.momentum": "components/test_optimizer.py::test_sgd_honours_every_field",
    "optimizer.dampening": "components/test_optimizer.py::test_sgd_honours_every_field",
    "optimizer.nesterov": "components/test_optimizer.py::test_sgd_honours_every_field",
    # lr_scheduler
    "lr_scheduler.warmup_steps": "components/test_lr_scheduler.py::test_cosine_closed_form",
    "lr_scheduler.decay_type": "components/test_lr_scheduler.py::test_linear_closed_form",
    "lr_scheduler.decay_ratio": "components/test_lr_scheduler.py::test_decay_ratio_adds_a_plateau",
    "lr_scheduler.min_lr_factor": "components/test_lr_scheduler.py::test_cosine_closed_form",
    # loss
    "loss.reduction": "trainer/test_trainer.py::test_sum_reduction_weights_every_token_equally_across_micro_batches",
    "loss.ignore_index": "components/test_loss.py::test_custom_ignore_index",
    "loss.label_smoothing": "components/test_loss.py::test_label_smoothing_and_z_loss",
    "loss.z_loss_weight": "components/test_loss.py::test_label_smoothing_and_z_loss",
    "loss.chunk_tokens": "components/test_chunked_loss.py::"
    "test_the_trainer_with_the_fused_loss_takes_the_same_steps_as_with_the_whole_logits",
    # training
    "training.max_steps": "trainer/test_trainer.py::test_trainer_builds_from_the_config_alone_and_trains_every_step",
    "training.epochs": "trainer/test_trainer.py::test_epochs_train_whole_passes_log_the_epoch_and_resume_exactly",
    "training.global_batch_size": (
        "trainer/test_trainer.py::test_gradient_accumulation_matches_one_micro_batch_holding_the_whole_global_batch"
    ),
    "training.micro_batch_size": (
        "trainer/test_trainer.py::test_gradient_accumulation_matches_one_micro_batch_holding_the_whole_global_batch"
    ),
    "training.seq_len": "trainer/test_trainer.py::test_trainer_builds_from_the_config_alone_and_trains_every_step",
    "training.seed": "trainer/test_trainer.py::test_debug_seed_replaces_training_seed_for_weights_and_data",
    "training.max_grad_norm": "trainer/test_trainer.py::test_max_grad_norm_clips_and_null_only_measures",
    "training.mixed_precision_param": "trainer/test_trainer.py::test_bfloat16_without_fsdp_computes_under_autocast",
    "training.mixed_precision_reduce": "parallel/test_parallelize.py::test_fsdp_applies_mixed_precision_offload_and_reshard",
    "training.init_device": "trainer/test_trainer.py::test_init_device_cpu_and_meta_start_from_the_same_weights",
    "training.gc_freq": "trainer/test_trainer.py::test_gc_freq_turns_off_automatic_collection_and_collects_every_n_steps",
    "training.enable_cpu_offload": "parallel/test_parallelize.py::test_fsdp_applies_mixed_precision_offload_and_reshard",
    "training.signal_check_freq": "trainer/test_host_sync.py::test_stop_flags_are_compared_every_signal_check_freq_steps",
    "training.cpu_threads": "trainer/test_trainer.py::test_cpu_threads_are_set_and_named_and_the_bar_is_cleared_before_the_last_line",
    "training.peak_tflops": "trainer/test_trainer.py::test_logged_records_carry_tflops_from_the_preflight_count_and_mfu_against_the_peak",
    # parallelism
    "parallelism.dp_replicate": "trainer/test_layouts.py::test_hsdp_matches_one_process_and_shards_within_replicas",
    "parallelism.dp_shard": "trainer/test_parallel.py::test_two_processes_match_one_and_really_shard",
    "parallelism.tp": "trainer/test_parallel.py::test_two_processes_match_one_and_really_shard",
    "parallelism.sequence_parallel": "trainer/test_parallel.py::test_two_processes_match_one_and_really_shard",
    "parallelism.fsdp_reshard_after_forward": "parallel/test_parallelize.py::test_fsdp_applies_mixed_precision_offload_and_reshard",
    "parallelism.pp": "trainer/test_pipeline.py::test_pipeline_matches_one_process_and_each_rank_holds_its_stages",
    "parallelism.pp_schedule": "trainer/test_pipeline.py::test_pipeline_matches_one_process_and_each_rank_holds_its_stages",
    "parallelism.pp_microbatches": "trainer/test_pipeline.py::test_pp_microbatches_sets_the_schedule_micro_batches",
    "parallelism.ep": "trainer/test_expert_parallel.py::test_ep2_of_dp_shard4_matches_one_process_and_splits_the_experts",
    # checkpoint
    "checkpoint.enable": "components/test_checkpoint_resume.py::test_without_enable_the_folder_is_neither_resumed_nor_touched",
    "checkpoint.folder": "trainer/test_trainer.py::test_resume_continues_with_bitwise_equal_losses",
    "checkpoint.interval": "components/test_checkpoint.py::test_interval_first_step_and_keep_latest_k",
    "checkpoint.keep_latest_k": "components/test_checkpoint.py::test_interval_first_step_and_keep_latest_k",
    "checkpoint.initial_load_path": "components/test_checkpoint_resume.py::test_initial_load_path_with_full_state",
    "checkpoint.initial_load_model_only": "components/test_checkpoint.py::test_initial_load_path_and_model_only_export",
    "checkpoint.load_step": "components/test_checkpoint_resume.py::test_load_step_naming_an_export_of_an_extended_run_is_refused",
    "checkpoint.exclude_from_loading": "components/test_checkpoint.py::test_exclude_from_loading_keeps_the_fresh_state",
    "checkpoint.last_save_model_only": "components/test_checkpoint_resume.py::test_a_run_that_ended_with_an_export_is_finished",
    "checkpoint.accept_changed_base": "trainer/test_lora_base_identity.py::test_a_resume_on_a_base_updated_in_place_is_refused_unless_accepted",
    "checkpoint.export_dtype": "components/test_checkpoint_resume.py::test_export_dtype_is_the_dtype_of_the_final_export",
    "checkpoint.async_mode": "trainer/test_parallel.py::test_async_checkpoints_under_fsdp_finish_and_resume",
    "checkpoint.enable_first_step_checkpoint": (
        "components/test_checkpoint.py::test_interval_first_step_and_keep_latest_k"
    ),
    # activation_checkpoint
    "activation_checkpoint.mode": "parallel/test_runtime.py::test_activation_checkpointing_recomputes_per_mode",
    "activation_checkpoint.selective_option": "parallel/test_runtime.py::test_selective_layer_checkpointing_recomputes_every_nth_block",
    "activation_checkpoint.preserve_rng_state": "parallel/test_runtime.py::test_checkpoint_options_reach_torch",
    "activation_checkpoint.early_stop": "parallel/test_runtime.py::test_checkpoint_options_reach_torch",
    # metrics
    "metrics.log_freq": "components/test_metrics.py::test_records_every_log_freq_steps_to_console_and_jsonl",
    "metrics.rank0_only": "components/test_metrics.py::test_every_rank_writes_its_own_file_when_configured",
    "metrics.enable_tensorboard": "components/test_metrics.py::test_tensorboard_scalars_when_available",
    "metrics.tensorboard_folder": "components/test_metrics.py::test_tensorboard_scalars_when_available",
    "metrics.enable_wandb": "components/test_metrics.py::test_wandb_offline_keeps_the_logged_scalars_in_the_run_folder",
    "metrics.wandb_project": "components/test_metrics.py::test_wandb_offline_keeps_the_logged_scalars_in_the_run_folder",
    "metrics.wandb_folder": "components/test_metrics.py::test_wandb_offline_keeps_the_logged_scalars_in_the_run_folder",
    "metrics.enable_jsonl": "trainer/test_trainer.py::test_validation_runs_every_freq_steps_and_is_logged",
    "metrics.jsonl_path": "trainer/test_trainer.py::test_validation_runs_every_freq_steps_and_is_logged",
    "metrics.run_name": "trainer/test_cli.py::test_shipped_debug_config_learns_on_the_cpu",
    # profiler
    "profiler.enable": "trainer/test_trainer.py::test_profiler_traces_the_steps_of_its_schedule",
    "profiler.profile_freq": "trainer/test_trainer.py::test_profiler_traces_the_steps_of_its_schedule",
    "profiler.save_traces_folder": "trainer/test_trainer.py::test_profiler_traces_the_steps_of_its_schedule",
    "profiler.wait": "components/test_profiler.py::test_explicit_wait",
    "profiler.warmup": "components/test_profiler.py::test_schedule_writes_one_trace_per_cycle",
    "profiler.active": "components/test_profiler.py::test_schedule_writes_one_trace_per_cycle",
    "profiler.record_memory": "components/test_profiler.py::test_record_memory_and_with_stack_reach_the_trace",
    "profiler.record_shapes": "components/test_profiler.py::test_schedule_writes_one_trace_per_cycle",
    "profiler.with_stack": "components/test_profiler.py::test_record_memory_and_with_stack_reach_the_trace",
    # validator
    "validator.enable": "trainer/test_trainer.py::test_validation_runs_every_freq_steps_and_is_logged",
    "validator.freq": "trainer/test_trainer.py::test_validation_runs_every_freq_steps_and_is_logged",
    "validator.steps": "components/test_dataloader.py::test_validator_steps_fix_the_set_in_samples",
    "validator.micro_batch_size": "components/test_validator.py::test_built_validation_loader_gives_the_same_pass_every_time",
    "validator.dataset.source": "trainer/test_trainer.py::test_validation_runs_every_freq_steps_and_is_logged",
    "validator.dataset.paths": "components/test_validator.py::test_built_validation_loader_gives_the_same_pass_every_time",
    "validator.dataset.text_field": (
        "components/test_validator.py::test_built_validation_loader_gives_the_same_pass_every_time"
    ),
    "validator.dataset.seed": "trainer/test_data_config_checks.py::test_settings_the_runtime_would_not_honour_are_refused",
    "validator.dataset.pack_sequences": (
        "components/test_validator.py::test_built_validation_loader_gives_the_same_pass_every_time"
    ),
    "validator.dataset.document_masking": "trainer/test_trainer.py::test_packed_documents_are_kept_apart_unless_document_masking_is_off",
    "validator.dataset.max_samples": "components/test_dataloader.py::test_max_samples_and_drop_last",
    "validator.dataset.weights": "components/test_data_tokenized.py::test_a_mixture_blends_sources_by_weight_in_every_window",
    "validator.dataset.holdout_fraction": (
        "components/test_data_tokenized.py::test_a_held_out_fraction_never_shares_a_document_with_training"
    ),
    "validator.dataset.split": "components/test_data_tokenized.py::test_a_held_out_fraction_never_shares_a_document_with_training",
    "validator.dataset.overlong": "components/test_data_packing.py::test_the_loader_refuses_drops_or_cuts_an_overlong_conversation",
    "validator.dataset.train_on": "components/test_data_packing.py::test_the_chat_source_refuses_records_without_a_label_and_drops_them_when_told",
    "validator.dataset.drop_unlabeled": "components/test_data_packing.py::test_the_chat_source_refuses_records_without_a_label_and_drops_them_when_told",
    "validator.dataset.synthetic_num_samples": "trainer/test_trainer.py::test_validation_runs_every_freq_steps_and_is_logged",
    # refused with any image source (validation feeds tokens only), read by no validator yet
    "validator.dataset.image_min_pixels": "trainer/test_image_chat.py::test_the_pixel_bounds_set_the_image_size",
    "validator.dataset.image_max_pixels": "trainer/test_image_chat.py::test_the_pixel_bounds_set_the_image_size",
    # debug
    "debug.seed": "trainer/test_trainer.py::test_debug_seed_replaces_training_seed_for_weights_and_data",
    "debug.deterministic": "trainer/test_trainer.py::test_debug_switches_reach_torch",
    "debug.deterministic_warn_only": "trainer/test_trainer.py::test_debug_switches_reach_torch",
    "debug.detect_anomaly": "trainer/test_trainer.py::test_debug_switches_reach_torch",
    "debug.check_nan_inf": "trainer/test_trainer.py::test_check_nan_inf_stops_with_a_message_naming_the_step",
    "debug.print_config": "trainer/test_trainer.py::test_print_config_prints_the_resolved_config_on_rank_zero",
    # compile
    "compile.enable": "trainer/test_trainer.py::test_compiling_the_loss_uses_the_configured_backend",
    "compile.components": "trainer/test_trainer.py::test_compiling_the_loss_uses_the_configured_backend",
    "compile.backend": "trainer/test_trainer.py::test_compiling_the_loss_uses_the_configured_backend",
    "compile.mode": "trainer/test_trainer.py::test_compile_mode_and_fullgraph_reach_torch_compile_for_blocks_and_loss",
    "compile.fullgraph": "trainer/test_trainer.py::test_compile_mode_and_fullgraph_reach_torch_compile_for_blocks_and_loss",
    # comm
    "comm.backend": "trainer/test_launch_checks.py::test_devices_and_backends_this_machine_lacks_are_refused",
    "comm.init_timeout_seconds": "trainer/test_parallel.py::test_two_processes_match_one_and_really_shard",
    "comm.train_timeout_seconds": "trainer/test_parallel.py::test_two_processes_match_one_and_really_shard",
    "comm.trace_buf_size": "trainer/test_launch_checks.py::test_nccl_flight_recorder_follows_comm_and_other_backends_have_none",
    "comm.save_traces_folder": (
        "trainer/test_launch_checks.py::test_nccl_flight_recorder_follows_comm_and_other_backends_have_none"
    ),
    # peft
    "peft.rank": "trainer/test_peft.py::test_rank_alpha_dropout_and_targets_shape_what_an_adapter_adds",
    "peft.alpha": "trainer/test_peft.py::test_rank_alpha_dropout_and_targets_shape_what_an_adapter_adds",
    "peft.dropout": "trainer/test_peft.py::test_rank_alpha_dropout_and_targets_shape_what_an_adapter_adds",
    "peft.targets": "trainer/test_peft.py::test_rank_alpha_dropout_and_targets_shape_what_an_adapter_adds",
    "peft.base_dtype": "trainer/test_qlora.py::test_qlora_trains_the_adapters_over_a_frozen_nf4_base",
    "peft.quantize_embeddings": "trainer/test_qlora.py::test_the_whole_frozen_base_is_nf4_and_the_compute_dtype",
}

#: Fields this release refuses, with a value that must be refused as "not supported yet".
REFUSED: dict[str, str] = {
    "parallelism.cp": "2",
}


def _implementations(base: type) -> Iterator[type]:
    """``base`` and every subclass defined in the package (the classes a ``_target_`` may name)."""
    yield base
    for sub in base.__subclasses__():
        if sub.__module__.startswith("hyper_parallel."):
            yield from _implementations(sub)


def _leaves(cls: type, prefix: str) -> Iterator[str]:
    hints = get_type_hints(cls)
    for field in attrs.fields(cls):
        kind = hints[field.name]
        if isinstance(kind, type) and issubclass(kind, ModelArgs):
            yield f"{prefix}{field.name}"  # architecture arguments: read by the model builder as a whole
        elif isinstance(kind, type) and attrs.has(kind):
            yield from _leaves(kind, f"{prefix}{field.name}.")
        elif hasattr(kind, "__variants__"):  # one class per variant (dataset sources): each one's fields
            for variant in kind.__variants__:
                yield from _leaves(variant, f"{prefix}{field.name}.")
        else:
            yield f"{prefix}{field.name}"


@cache
def all_leaf_fields() -> frozenset[str]:
    """Every leaf path of every shipped implementation of every root group."""
    paths: set[str] = set()
    hints = get_type_hints(TrainerConfig)
    for field in attrs.fields(TrainerConfig):
        for cls in _implementations(hints[field.name]):
            paths.update(_leaves(cls, f"{field.name}."))
    return frozenset(paths)


@cache
def _test_names(file: str) -> frozenset[str]:
    tree = ast.parse((TESTS / file).read_text(encoding="utf-8"))
    return frozenset(node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef))


def test_every_field_is_wired_or_refused() -> None:
    listed = set(WIRED) | set(REFUSED)
    assert sorted(all_leaf_fields() - listed) == [], "fields neither wired nor refused"
    assert sorted(listed - all_leaf_fields()) == [], "listed fields that do not exist"
    assert set(WIRED).isdisjoint(REFUSED)


@pytest.mark.parametrize("field", sorted(WIRED))
def test_the_test_observing_each_wired_field_exists(field: str) -> None:
    file, _, name = WIRED[field].partition("::")
    assert (TESTS / file).is_file(), WIRED[field]
    assert name in _test_names(file), WIRED[field]


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_each_refused_field_is_refused_at_resolve_time_as_not_supported_yet(field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        tiny_config("llama3", {field: REFUSED[field]})
    messages = [issue.message for issue in caught.value.issues if issue.path == field]
    assert messages, [(i.path, i.message) for i in caught.value.issues]
    assert all("not supported yet" in message for message in messages)
