"""Statistics over every rank of a distributed run (plain values when there is one process).

Batch statistics that a loss depends on (KTO's KL baseline, batch-scaled advantages, the entropy
threshold, token counts) are taken over the global batch, so that a run on N ranks computes what
one rank with the whole batch would. Every rank must call these at the same point."""
from __future__ import annotations

import torch
import torch.distributed as dist


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def global_mean(values: torch.Tensor) -> torch.Tensor:
    """Mean of `values` (any shape) over every rank's elements."""
    if not distributed():
        return values.mean()
    totals = torch.stack([values.detach().float().sum(), torch.tensor(float(values.numel()), device=values.device)])
    totals = totals.to(_device())
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).to(values.device, values.dtype)


def gather_cat(values: torch.Tensor) -> torch.Tensor:
    """Every rank's 1-D `values` (lengths may differ), concatenated in rank order."""
    if not distributed():
        return values
    device = _device()
    size = torch.tensor([values.numel()], device=device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=values.dtype, device=device)
    padded[:values.numel()] = values.detach().to(device)
    parts = [torch.zeros_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([p[:int(s.item())] for p, s in zip(parts, sizes)]).to(values.device)
