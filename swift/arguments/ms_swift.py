"""ms-swift's documented flags that this version recognises but does not implement, each with the
reason. A command line carrying one stops with one line saying so (never "unknown flag");
docs/cli.md lists every ms-swift flag as supported or refused (`python -m swift.arguments.ms_swift`
prints that table's refused part)."""
from __future__ import annotations

_ENGINE = "this version's engines are transformers and vllm (--infer_backend)"
_MULTIMODAL = "multimodal models are not supported (text-only causal LMs)"
_NO_TUNER = "this tuner is not implemented (--tuner_type lora|full)"
_QUANT = ("only bitsandbytes is implemented for loading (QLoRA; vLLM runs what a checkpoint's config says); "
          "`swift export` writes bnb, GPTQ and GGUF; AWQ/FP8 export and HQQ are not")
_VLLM_PARALLEL = "each vLLM engine runs on one device here; parallel layouts are not wired up"

REASONS: dict[str, tuple[str, ...]] = {
    # -- model / base ------------------------------------------------------------------------------
    "models and plugins load from directories and built-in names; registration files are not read":
        ("custom_register_path", "custom_dataset_info", "local_repo_path"),
    "the tuner backend is always PEFT": ("tuner_backend",),
    "extra from_pretrained keyword arguments are not passed through": ("model_kwargs", "init_strategy"),
    "settings are not reloaded from a checkpoint's args.json; pass the flags again (or --config)":
        ("load_args", "load_data_args"),
    "flag errors always stop the command": ("ignore_args_error",),
    "the tokenizer's vocabulary is used as saved": ("new_special_tokens",),
    "sequence classification uses the default problem type of --num_labels": ("problem_type",),
    "RoPE scaling is read from the model's config only": ("rope_scaling", "max_model_len"),
    "models load onto one device per process (multi-GPU: NPROC_PER_NODE)": ("device_map", "max_memory"),
    # -- data ----------------------------------------------------------------------------------------
    "a cached dataset's own val split (--split_dataset_ratio or --val_dataset of `swift export "
    "--to_cached_dataset`) validates; --cached_dataset takes the folder":
        ("cached_val_dataset",),
    "datasets are concatenated, not interleaved": ("interleave_prob", "stopping_strategy"),
    "streaming reads rows in file order without a shuffle buffer": ("shuffle_buffer_size",),
    "hub downloads reuse the local cache": ("download_mode",),
    "the validation split is not shuffled": ("val_dataset_shuffle",),
    # -- template ------------------------------------------------------------------------------------
    _MULTIMODAL: ("max_pixels", "norm_bbox", "freeze_llm", "freeze_vit", "freeze_aligner", "vit_gradient_checkpointing",
                  "vit_lr", "aligner_lr", "vllm_limit_mm_per_prompt", "vllm_mm_processor_cache_gb", "is_multimodal"),
    "tools are rendered by the model's own chat template; agent templates are not implemented": ("agent_template",),
    "conversations always use the chat template (swift pt trains on raw text)": ("use_chat_template",),
    "padding is on the right for training and on the left for generation": ("padding_side",),
    "sequence parallelism is not implemented": ("sequence_parallel_size",),
    "templates are swift's own (or the tokenizer's Jinja template via --template jinja)": ("template_backend",),
    "answers are generated without a forced prefix": ("response_prefix",),
    "thinking switches of Qwen3-style templates are not implemented": ("enable_thinking", "add_non_thinking_prefix"),
    # -- generation ----------------------------------------------------------------------------------
    "beam search is not implemented (sampling and greedy are)": ("num_beams",),
    "guided (structured) decoding is not implemented": ("structured_outputs_regex",),
    _QUANT: ("hqq_axis", "vllm_quantization"),
    "Ray-based placement is not implemented; ranks are launched with NPROC_PER_NODE/NNODES":
        ("use_ray", "ray_exp_name", "device_groups"),
    # -- training ------------------------------------------------------------------------------------
    "ZeRO++ hierarchical partitioning and DeepSpeed AutoTP are not wired up (--deepspeed zero0..zero3_offload "
    "or a JSON file work)": ("zero_hpz_partition_size", "deepspeed_autotp_size"),
    "the teacher runs under the student's --deepspeed configuration (partitioned under ZeRO-3)":
        ("teacher_deepspeed",),
    "under ZeRO-3 the engine always receives the policy's weights gathered --weight_sync_bucket_mb at a time, "
    "never the whole model at once": ("ds3_gather_for_generation",),
    "MoE auxiliary losses are not added": ("router_aux_loss_coef",),
    "the SFT loss is cross-entropy only (DFT and channel losses are not implemented)":
        ("enable_dft_loss", "enable_channel_loss"),
    "TensorBoard events are written to <output_dir>/runs": ("logging_dir",),
    "training length is --num_train_epochs or --max_steps": ("max_epochs",),
    "--resume_from_checkpoint restores model, optimizer, scheduler and data position together":
        ("resume_only_model",),
    "the training data is always shuffled": ("train_dataloader_shuffle",),
    "length-grouped sampling is not implemented": ("group_by_length",),
    "the best checkpoint is not linked": ("create_checkpoint_symlink",),
    "packing fills sequences of --max_length in the main process": ("packing_length", "packing_num_proc"),
    "logits_to_keep is used whenever the model supports it": ("use_logits_to_keep",),
    "token accuracy is not computed during training": ("acc_strategy",),
    "the optimizer is chosen with --optim": ("optimizer",),
    "the built-in evaluator takes --eval_dataset_args and --eval_generation_config; EvalScope's extra arguments are "
    "not passed": ("extra_eval_args",),
    "OpenCompass's dataset download is not used; give local files with --eval_dataset PATH or --eval_dataset_args "
    "local_path": ("local_dataset",),
    "checkpoints are saved by the Hugging Face Trainer": ("use_flash_ckpt",),
    "early stopping is not implemented": ("early_stop_interval",),
    "SwanLab is not built in; use --report_to tensorboard or wandb":
        ("swanlab_token", "swanlab_project", "swanlab_workspace", "swanlab_exp_name", "swanlab_notification_method",
         "swanlab_webhook_url", "swanlab_secret", "swanlab_mode"),
    # -- tuners --------------------------------------------------------------------------------------
    "LoRA on parameters (rather than modules) is not implemented; choose modules with --target_modules or "
    "--target_regex": ("target_parameters",),
    "full tuning freezes with --freeze_parameters / --freeze_parameters_ratio":
        ("freeze_parameters_regex", "trainable_parameters_regex"),
    "LoRA+ (a larger learning rate for B) is not implemented": ("lorap_lr_ratio",),
    _NO_TUNER: ("lora_ga_batch_size", "lora_ga_iters", "lora_ga_max_length", "lora_ga_direction", "lora_ga_scale",
                "lora_ga_stable_gamma", "fourier_n_frequency", "fourier_scaling", "boft_block_size", "boft_block_num",
                "boft_dropout", "vera_rank", "vera_projection_prng_key", "vera_dropout", "vera_d_initial",
                "use_galore", "galore_target_modules", "galore_rank", "galore_update_proj_gap", "galore_scale",
                "galore_proj_type", "galore_optim_per_parameter", "galore_with_embedding", "galore_quantization",
                "galore_proj_quant", "galore_proj_bits", "galore_proj_group_size", "galore_cos_threshold",
                "galore_gamma_proj", "galore_queue_size", "lisa_activated_layers", "lisa_step_interval",
                "llamapro_num_new_blocks", "llamapro_num_groups", "adalora_target_r", "adalora_init_r",
                "adalora_tinit", "adalora_tfinal", "adalora_deltaT", "adalora_beta1", "adalora_beta2",
                "adalora_orth_reg_weight", "reft_layers", "reft_rank", "reft_intervention_type", "reft_args"),
    # -- engines -------------------------------------------------------------------------------------
    _VLLM_PARALLEL: ("vllm_tensor_parallel_size", "vllm_pipeline_parallel_size", "vllm_data_parallel_size",
                     "vllm_enable_expert_parallel", "vllm_disable_custom_all_reduce"),
    "vLLM's batch size is --max_batch_size": ("vllm_max_num_seqs",),
    "vLLM runs with its own defaults for speculative decoding, cascade attention, prefix caching and engine "
    "options": ("vllm_speculative_config", "vllm_disable_cascade_attn", "vllm_enable_prefix_caching",
                "vllm_use_async_engine", "vllm_engine_kwargs"),
    "LoRA adapters are served by vLLM with a maximum rank of 64": ("vllm_max_lora_rank",),
    "reasoning parsers are not implemented": ("vllm_reasoning_parser",),
    _ENGINE: ("sglang_tp_size", "sglang_pp_size", "sglang_dp_size", "sglang_ep_size", "sglang_enable_ep_moe",
              "sglang_mem_fraction_static", "sglang_context_length", "sglang_disable_cuda_graph", "sglang_quantization",
              "sglang_kv_cache_dtype", "sglang_enable_dp_attention", "sglang_disable_custom_all_reduce",
              "sglang_speculative_algorithm", "sglang_speculative_num_steps", "sglang_speculative_eagle_topk",
              "sglang_speculative_num_draft_tokens", "lmdeploy_tp", "lmdeploy_session_len",
              "lmdeploy_cache_max_entry_count", "lmdeploy_quant_policy", "lmdeploy_vision_batch_size"),
    "adapters are merged with `swift merge-lora` or `swift export --merge_lora true` before serving a merged model":
        ("merge_lora", "max_shard_size"),
    # -- rlhf ----------------------------------------------------------------------------------------
    "reference, reward and teacher models load as given (no separate adapters, model types or revisions)":
        ("ref_model_type", "ref_model_revision", "reward_adapters", "reward_model_type",
         "reward_model_revision", "teacher_adapters", "teacher_model_type", "teacher_model_revision"),
    "this DPO loss variant is not implemented": ("ld_alpha", "discopop_tau"),
    "GKD keeps the teacher loaded": ("offload_teacher_model",),
    "PPO's completion budget is --max_completion_length": ("response_length",),
    "PPO's rollout forwards run one micro-batch (--per_device_train_batch_size) at a time":
        ("local_rollout_forward_batch_size",),
    "PPO evaluates by sampling the --val_dataset every --eval_steps, as GRPO": ("num_sample_generations",),
    "GRPO evaluation generates --num_generations samples": ("num_generations_eval",),
    "reward models are given by --reward_model / --reward_model_url; plugins register reward functions":
        ("reward_model_plugin",),
    "swift's rollout server protocol is its own (docs/rollout.md); these ms-swift server options do not apply":
        ("vllm_server_pass_dataset", "vllm_server_group_port", "enable_flattened_weight_sync"),
    "the colocated vLLM engine receives LoRA-merged weights": ("vllm_enable_lora",),
    "engine sleep and model/optimizer offloading between rollouts are not implemented":
        ("sleep_level", "offload_optimizer", "offload_model", "move_model_batches"),
    "each trajectory's completion budget is --max_completion_length over all its turns":
        ("completion_length_limit_scope",),
    "the reference model is not synced with the policy (TR-DPO/GRPO ref sync)":
        ("sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps"),
    "entropies are logged whenever --top_entropy_quantile < 1; off-policy metrics whenever --async_generate":
        ("log_entropy", "log_rollout_offpolicy_metrics"),
    "off-policy sequence masking is not implemented": ("off_policy_sequence_mask_delta",),
    "the environment's summed reward of --multi_turn_scheduler gym is the gym_reward reward function: name it in "
    "--reward_funcs": ("use_gym_env",),
    # -- infer / deploy / other commands -------------------------------------------------------------
    "batch inference writes each result as it finishes": ("write_batch_size",),
    "batch inference runs every row (take a sample with DATASET#N)": ("val_dataset_sample",),
    "rerankers are not supported": ("reranker_use_activation",),
    "the OpenAI server's fixed fields and request logging are not configurable":
        ("owned_by", "verbose", "log_interval"),
    "at most 20 top log-probs per token are returned": ("max_logprobs",),
    "`swift export --to_cached_dataset` encodes rows as `swift sft` and `swift pt` do (caches for `swift rlhf` are "
    "not built)": ("template_mode",),
    "`swift export` converts no Megatron-Core checkpoints (it merges, quantizes with bnb or GPTQ, writes GGUF and "
    "caches sft/pt datasets)":
        ("mcore_model", "mcore_adapters", "thread_count", "offload_bridge", "test_convert_precision",
         "test_convert_dtype"),
    "MCTS and distill caches are not implemented; an interrupted `swift sample` continues with --resume":
        ("cache_files",),
}

REFUSED: dict[str, str] = {flag: reason for reason, flags in REASONS.items() for flag in flags}


def refusal(name: str) -> str | None:
    """The one line for an ms-swift flag this version does not support, or None."""
    reason = REFUSED.get(name)
    if reason is None:
        return None
    return f"--{name} is an ms-swift flag this version does not support: {reason}"


if __name__ == "__main__":  # the refused rows of docs/cli.md's table
    for flag, reason in sorted(REFUSED.items()):
        print(f"| `--{flag}` | refused: {reason} |")
