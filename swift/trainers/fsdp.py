"""FSDP2 on CPU ranks. Accelerate turns its FSDP plugin on only for accelerator devices: on CPU
processes (gloo) it keeps the plugin aside and the run is silently plain DDP. PyTorch's FSDP2
(`fully_shard`) itself runs on CPU with gloo, so while the HF Trainer builds its Accelerator we make
the same switch Accelerate makes for GPU ranks."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def fsdp_on_cpu(training_args):
    """Within it, an Accelerator built with an FSDP plugin on several CPU processes shards with FSDP."""
    if not (training_args.fsdp and training_args.use_cpu and training_args.world_size > 1):
        yield
        return
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

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


def save_whole_model(trainer, output_dir: str) -> None:
    """With FSDP's sharded state dicts (the fsdp2 preset) HF's `save_model` writes no weights at the
    end of a run (its checkpoints hold the shards, for resuming); gather them so the output
    directory holds the whole model, as after a DDP run."""
    if not getattr(trainer, "is_fsdp_enabled", False):
        return
    if "FULL_STATE_DICT" in str(trainer.accelerator.state.fsdp_plugin.state_dict_type):
        return  # HF saved it whole already
    gathered: dict[int, object] = {}  # one gathered tensor per parameter, so tied weights stay tied
    state_dict = {}
    for name, t in trainer.model.state_dict(keep_vars=True).items():  # every rank takes part in each gather
        if id(t) not in gathered:
            gathered[id(t)] = whole(t.detach())
        state_dict[name] = gathered[id(t)]
    if trainer.args.should_save:
        trainer._save(output_dir, state_dict=state_dict)


def whole(tensor):
    """An FSDP2 parameter (a DTensor shard) gathered whole from every rank; others as they are."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
