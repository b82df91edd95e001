"""`--deepspeed zero0|zero1|zero2|zero3|zero2_offload|zero3_offload` (ms-swift's preset names) or a
JSON file. Presets leave batch sizes, accumulation, clipping and precision to the HF integration
("auto"), so they always agree with the training flags."""
from __future__ import annotations

import json
import os

from swift.utils.registry import SwiftError

_AUTO = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
         "train_batch_size": "auto", "gradient_clipping": "auto",
         "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
_OFFLOAD = {"device": "cpu", "pin_memory": True}
_STAGE3 = {"stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
           "reduce_bucket_size": "auto", "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
           "stage3_gather_16bit_weights_on_model_save": True, "sub_group_size": 1e9}
_STAGE12 = {"allgather_partitions": True, "allgather_bucket_size": 2e8, "reduce_scatter": True,
            "reduce_bucket_size": 2e8, "contiguous_gradients": True}


def _preset(stage: int, offload: bool = False) -> dict:
    zero: dict = {"stage": stage, "overlap_comm": False}
    if stage in (1, 2):
        zero.update(_STAGE12)
    if stage == 3:
        zero.update(_STAGE3)
    if offload:
        zero["offload_optimizer"] = dict(_OFFLOAD)
        if stage == 3:
            zero["offload_param"] = dict(_OFFLOAD)
    return {**_AUTO, "zero_optimization": zero, "steps_per_print": 10**9, "wall_clock_breakdown": False}


PRESETS = {"zero0": _preset(0), "zero1": _preset(1), "zero2": _preset(2), "zero3": _preset(3),
           "zero2_offload": _preset(2, offload=True), "zero3_offload": _preset(3, offload=True)}


def deepspeed_config(value: str | dict) -> dict:
    """The DeepSpeed config for `--deepspeed VALUE`: a preset name, a JSON file, or a dict."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        raise SwiftError("--deepspeed needs the deepspeed package: pip install -e \".[deepspeed]\"")
    if isinstance(value, dict):
        return value
    if value in PRESETS:
        return json.loads(json.dumps(PRESETS[value]))  # a fresh copy: HF fills the "auto" values in place
    if not os.path.isfile(value):
        raise SwiftError(f"--deepspeed {value}: not one of {', '.join(PRESETS)} and no such JSON file")
    try:
        with open(value) as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SwiftError(f"--deepspeed {value}: not a readable JSON file ({e})") from None
    if not isinstance(config, dict):
        raise SwiftError(f"--deepspeed {value}: the file must hold a JSON object")
    return config


def single_process_env() -> None:
    """DeepSpeed always runs in a process group; a run not started by a launcher is rank 0 of 1
    (without this DeepSpeed looks for MPI)."""
    if "RANK" in os.environ or "LOCAL_RANK" in os.environ:
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                      MASTER_PORT=os.environ.get("MASTER_PORT", str(port)))


def skip_cpu_shm_op() -> None:
    """On CPU, DeepSpeed's communication layer compiles a shared-memory all-reduce op with the C++
    compiler when its first process group starts (90–170 s on this 2-core machine, measured from
    ninja's log), and again in every fresh environment. Only its inference all-reduce (AutoTP)
    uses that op, falling back to torch.distributed without it; training never calls it."""
    import importlib

    # by module name: the attribute `deepspeed.comm.torch` is the torch package itself
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def init_distributed(training_args) -> None:
    """Join DeepSpeed's communication layer to the process group HF has set up (gloo on CPU), so
    ZeRO-3's partitioned model construction (`zero.Init`) sees every rank."""
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo" if training_args.use_cpu else "nccl")


def zero3(training_args) -> bool:
    """Whether these HF training arguments run DeepSpeed ZeRO-3."""
    config = getattr(training_args, "deepspeed_config", None) or training_args.deepspeed
    return isinstance(config, dict) and int((config.get("zero_optimization") or {}).get("stage", 0)) == 3

