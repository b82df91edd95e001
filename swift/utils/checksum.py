"""Bit-exact fingerprints of tensors, for checking weight transfers."""
from __future__ import annotations

import hashlib


def checksum(tensors) -> int:
    """SHA-256 over the bytes of the tensors in order, as a signed 64-bit integer (so it can travel
    in an int64 tensor). Equal checksums mean bit-identical tensors."""
    import torch

    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().to("cpu").contiguous()
        if t.numel():
            h.update(t.view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest()[:8], "little", signed=True)
