"""FSDP2 on CPU ranks. Accelerate turns its FSDP plugin on only for accelerator devices: on CPU
processes (gloo) it keeps the plugin aside and the run is silently plain DDP. PyTorch's FSDP2
(`fully_shard`) itself runs on CPU with gloo, so while the HF Trainer builds its Accelerator we make
the same switch Accelerate makes for GPU ranks."""
from __future__ import annotations

import contextlib

from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)


@contextlib.contextmanager
def fsdp_on_cpu(training_args):
    """Within it, an Accelerator built with an FSDP plugin on several CPU processes shards with FSDP.
    Checked after the build (`check_fsdp_ran`): a run asked to shard never trains silently as DDP."""
    if not (training_args.fsdp and training_args.use_cpu):
        yield
        return
    if training_args.world_size == 1:
        logger.info("--fsdp on one CPU process: nothing to shard, the model trains whole")
        yield
        return
    # HF's default is FSDP2 (before 2026-12-07 a config without "version" was taken for FSDP1 and refused)
    if int((training_args.fsdp_config or {}).get("version", 2)) != 2:
        raise SwiftError("--fsdp: on CPU ranks only FSDP2 shards (give --fsdp fsdp2, or fsdp_config version 2)")
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    if AcceleratorState._shared_state:  # built before (in this process): __init__ would not run again
        AcceleratorState._reset_state(reset_partial_state=False)

    original = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin

    AcceleratorState.__init__ = init
    try:
        yield
    finally:
        AcceleratorState.__init__ = original


def check_fsdp_ran(trainer) -> None:
    """One line, before any step, if `--fsdp` was asked for on several ranks but the run would be DDP."""
    args = trainer.args
    if args.fsdp and args.world_size > 1 and not getattr(trainer, "is_fsdp_enabled", False):
        raise SwiftError(f"--fsdp: the trainer was built without FSDP "
                         f"(distributed type {trainer.accelerator.distributed_type}); not training unsharded")


def save_whole_model(trainer, output_dir: str) -> None:
    """With FSDP's sharded state dicts (the fsdp2 preset) HF's `save_model` writes no weights at the
    end of a run (its checkpoints hold the shards, for resuming); gather them so the output
    directory holds the whole model, as after a DDP run."""
    if not getattr(trainer, "is_fsdp_enabled", False):
        return
    if "FULL_STATE_DICT" in str(trainer.accelerator.state.fsdp_plugin.state_dict_type):
        return  # HF saved it whole already
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # every rank takes part in each gather; each whole tensor goes to rank 0's CPU memory and only there
    state_dict = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True,
                                                                                cpu_offload=True))
    if trainer.args.should_save:
        trainer._save(output_dir, state_dict=state_dict)


def whole(tensor):
    """An FSDP2 parameter (a DTensor shard) gathered whole from every rank; others as they are."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
