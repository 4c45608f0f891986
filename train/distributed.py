"""Many trainer processes (torchrun): each rank holds a shard of the weights (FSDP2 `fully_shard`) and runs its
share of the micro-batches; the gradient reduce-scatter sums them. NCCL on GPUs, gloo on the CPU."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_reduce", "full_state_dict", "init_from_env", "is_main", "shard", "world"]


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    return world()[0] == 0


def init_from_env(device: torch.device) -> bool:
    """Join the torchrun job named by the environment (WORLD_SIZE > 1); True when in one."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return True


def shard(module: torch.nn.Module, inner: Any) -> torch.nn.Module:
    """FSDP2: one group per decoder layer of `inner` (the HF or peft model), the rest (embeddings, norm, head) in
    the root group of `module`, the wrapper whose forward runs the whole model. Reduce-scatter averages gradients
    over the ranks, so each rank scales its loss (normalised over the whole batch) by the world size."""
    from torch.distributed.fsdp import fully_shard

    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    for layer in getattr(base, base.base_model_prefix).layers:
        fully_shard(layer)
    fully_shard(module)
    return module


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Element-wise sum (or max) of a list of floats over the ranks; the list itself outside a process group."""
    if world()[1] == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t.cpu().tolist()


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights on the CPU (every rank takes part; rank 0 gets them, the others an empty dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
