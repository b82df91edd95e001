"""DeepSpeed ZeRO-3 and FSDP in the trainers: frozen helper models partitioned like the policy, and
the policy's weights gathered a bucket at a time for an inference engine (never the whole model at
once on top of its partitions)."""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import torch

from swift.arguments.deepspeed import zero3

Named = list[tuple[str, torch.Tensor]]
# parameter-name parts of PEFT's wrappers; what precedes one names the wrapped layer
_WRAPPED = (".base_layer.", ".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.", ".lora_magnitude_vector.",
            ".modules_to_save.", ".original_module.")


def zero3_enabled(trainer) -> bool:
    """Whether `trainer` (an HF Trainer) runs DeepSpeed ZeRO-3."""
    return bool(trainer.is_deepspeed_enabled and zero3(trainer.args))


def sharded(trainer) -> bool:
    """Whether the policy's weights are split across ranks (ZeRO-3 or FSDP)."""
    return zero3_enabled(trainer) or bool(getattr(trainer, "is_fsdp_enabled", False))


def frozen_zero3(model, trainer):
    """A frozen helper model (reference, teacher, reward model) under ZeRO-3: partitioned across the
    ranks like the policy, in an inference-only DeepSpeed engine whose forward gathers each layer's
    weights as it runs (every rank must run the same forwards, which the trainers do)."""
    import deepspeed

    config = json.loads(json.dumps(trainer.args.hf_deepspeed_config.config))
    for key in ("optimizer", "scheduler"):
        config.pop(key, None)
    zero = config["zero_optimization"]
    zero.pop("offload_optimizer", None)
    hidden = getattr(model.config, "hidden_size", None) or 1024
    for key, value in (("reduce_bucket_size", hidden * hidden), ("stage3_param_persistence_threshold", 10 * hidden),
                       ("stage3_prefetch_bucket_size", int(0.9 * hidden * hidden))):
        if zero.get(key) == "auto":
            zero[key] = value
    config["train_micro_batch_size_per_gpu"] = trainer.args.per_device_train_batch_size
    config.pop("train_batch_size", None)
    config["gradient_accumulation_steps"] = 1
    engine, *_ = deepspeed.initialize(model=model, config=config)
    engine.eval()  # DeepSpeed's eval() returns None
    return engine


def whole_copy(model) -> torch.nn.Module:
    """A plain (unpartitioned, adapter-free) model of the policy's architecture for an in-process
    engine to generate with; its weights arrive from `gathered_buckets` before every rollout."""
    from swift.model.loader import whole_weights

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    with whole_weights(), torch.random.fork_rng(devices=[]):  # its random init must not move the sampling RNG
        copy = type(inner)(inner.config)
    return copy.to(dtype=inner.dtype).eval().requires_grad_(False)


def _owner(name: str) -> str:
    """The layer a parameter belongs to for merging: a LoRA layer's base weight and its A/B travel together."""
    for part in _WRAPPED:
        if part in name:
            return name[:name.index(part)]
    return name


def gathered_buckets(model, bucket_mb: float) -> Iterator[Named]:
    """The policy's weights under Hugging Face names (LoRA merged, a tied output layer included),
    `bucket_mb` MiB of parameters gathered at a time (ZeRO-3 partitions or FSDP2 shards). Collective:
    every rank must run it through."""
    from peft.tuners.lora import LoraLayer

    from swift.infer.vllm_engine import hf_name, merged_weight

    peft = hasattr(model, "peft_config")
    lora = {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}
    groups: dict[str, list[tuple[str, torch.nn.Parameter]]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(_owner(name), []).append((name, p))
    limit, size, bucket = bucket_mb * 2 ** 20, 0.0, []
    units = list(groups.items())
    for i, (owner, params) in enumerate(units):
        bucket.append((owner, params))
        size += sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for _, p in params)
        if size < limit and i + 1 < len(units):
            continue
        with _gathered(model, bucket), torch.no_grad():
            out = []
            for owner_name, ps in bucket:
                for name, _ in ps:
                    if "lora_" in name or "original_module" in name:
                        continue
                    p = model.get_parameter(name)  # FSDP2 registers the gathered parameter in the shard's place
                    tensor = merged_weight(lora.get(owner_name), name, p.data)
                    out.append((hf_name(name) if peft else name,
                                tensor.detach().to("cpu", copy=True).contiguous()))
        yield out
        size, bucket = 0.0, []


def _gathered(model, bucket):
    """Within it, the bucket's parameters (and the LoRA weights of its layers) are whole on every rank."""
    params = [p for _, ps in bucket for _, p in ps]
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        return deepspeed.zero.GatheredParameters(list({id(p): p for p in params}.values()), modifier_rank=None)
    if any(hasattr(p, "full_tensor") for p in params):
        return _fsdp_unsharded(model, [name for _, ps in bucket for name, _ in ps])
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_unsharded(model, names: list[str]):
    """FSDP2: unshard each unit (a `fully_shard`ed module, e.g. a decoder layer) owning these parameters."""
    from torch.distributed.fsdp import FSDPModule

    units: list = []
    for name in names:
        path = name.split(".")[:-1]
        while not isinstance(model.get_submodule(".".join(path)), FSDPModule):
            path.pop()  # the root is a unit too
        unit = model.get_submodule(".".join(path))
        if all(unit is not u for u in units):
            units.append(unit)
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
