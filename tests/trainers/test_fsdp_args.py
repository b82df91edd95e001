"""`--fsdp` with HF's own values on CPU ranks: HF's default FSDP version is 2."""
from types import SimpleNamespace

import pytest

from swift.trainers.fsdp import fsdp_on_cpu
from swift.utils.registry import SwiftError


def test_hf_fsdp_values_without_a_version_are_fsdp2_on_cpu_ranks():
    """`--fsdp "full_shard auto_wrap"` without `version` in --fsdp_config is FSDP2 to HF 5 (before
    2026-12-07 it was taken for FSDP1 and refused); version 1 still is refused."""
    args = SimpleNamespace(fsdp=["full_shard", "auto_wrap"], use_cpu=True, world_size=2, fsdp_config={})
    with fsdp_on_cpu(args):
        pass
    with pytest.raises(SwiftError, match="on CPU ranks only FSDP2 shards"):
        with fsdp_on_cpu(SimpleNamespace(**{**vars(args), "fsdp_config": {"version": 1}})):
            pass
