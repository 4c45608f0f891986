"""Full weights to a colocated vLLM without the disk: the trainer's CUDA tensors handed over by CUDA IPC, in the
update format of vLLM's native `ipc` weight-transfer backend (`/update_weights`; vLLM ≥ 0.32). Only torch here: the
trainer's environment has no vLLM.

Two wire forms, agreed with the server at `/init_weight_transfer_engine` (`packed`):
  unpacked  one IPC handle per tensor, all in one request (`ipc_update_info`)
  packed    the tensors flattened into buckets: one IPC buffer, one request per bucket carrying the names, dtypes,
            shapes and byte sizes the worker splits it by (`ipc_updates`; vLLM's `packed_ipc_consumer`). Measured
            2.7-4.3x faster than one handle per tensor elsewhere: a worker opens one mapping, not hundreds.

vLLM ships the producer of the packed form too (`packed_ipc_producer` in vllm/distributed/weight_transfer/
packed_tensor.py), but it cannot be imported in the trainer's environment, so the few lines that fill the buffer are
written here, to the same rules: one buffer exported once and rewritten for each bucket after the server has answered
the previous request, a bucket closed when the next tensor would overflow it. Two differences: a tensor larger than a
bucket goes alone (the buffer is sized to the largest tensor) where vLLM's producer refuses it, and a bucket is laid
out widest dtype first, so that each tensor's offset suits its dtype (`pack_buckets`).
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

__all__ = ["bucket_groups", "buffer_bytes", "cuda_handle", "ipc_update_info", "ipc_updates", "pack_buckets"]

Share = Callable[[torch.Tensor, str], dict[str, tuple[Any, ...]]]  # tensor, name -> {GPU uuid: rebuild args}


def cuda_handle(tensor: torch.Tensor, name: str) -> dict[str, tuple[Any, ...]]:
    """The CUDA-IPC handle of `tensor`, keyed by its GPU's uuid (the worker looks its own GPU up there)."""
    from torch.multiprocessing.reductions import reduce_tensor

    if tensor.device.type != "cuda":
        raise ValueError(f"CUDA IPC needs CUDA tensors; {name} is on {tensor.device}")
    return {str(torch.cuda.get_device_properties(tensor.device).uuid): reduce_tensor(tensor)[1]}


def _pickled(handles: Any) -> str:
    """Handles as vLLM's HTTP route takes them: pickled, base64 (the server needs VLLM_ALLOW_INSECURE_SERIALIZATION=1)."""
    return base64.b64encode(pickle.dumps(handles)).decode()


def ipc_update_info(
    named: Iterable[tuple[str, torch.Tensor]], share: Share = cuda_handle
) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """vLLM's unpacked IPC update_info for these CUDA tensors (HF names), one handle per tensor, and the tensors the
    handles point into: keep them alive until the engine has finished the update (the worker's layerwise reload
    reads them up to `/finish_weight_update`)."""
    names, dtypes, shapes, handles, refs = [], [], [], [], []
    for name, tensor in named:
        weight = tensor.detach().contiguous()
        names.append(name)
        dtypes.append(str(weight.dtype).removeprefix("torch."))
        shapes.append(list(weight.shape))
        handles.append(share(weight, name))
        refs.append(weight)
    return {"names": names, "dtype_names": dtypes, "shapes": shapes, "ipc_handles_pickled": _pickled(handles)}, refs


def bucket_groups(sizes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """The indices of tensors of these byte sizes, in order, grouped into buckets of at most `bucket_bytes`: a
    bucket closes when the next tensor would overflow it; a tensor larger than a bucket goes alone."""
    groups: list[list[int]] = []
    fill = 0
    for i, n in enumerate(sizes):
        if not groups or (fill and fill + n > bucket_bytes):
            groups.append([])
            fill = 0
        groups[-1].append(i)
        fill += n
    return groups


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().view(-1).view(torch.uint8)  # (bytes,); a 0-d tensor gives its one element


def pack_buckets(
    named: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int, buffer: torch.Tensor
) -> Iterator[dict[str, list[Any]]]:
    """Fill `buffer` (uint8, at least `buffer_bytes(...)` long) with each bucket's tensors back to back and yield the
    bucket's metadata in vLLM's packed format. The next bucket overwrites the buffer: send each before asking for the
    next."""
    tensors = [t for _, t in named]
    for group in bucket_groups([t.numel() * t.element_size() for t in tensors], bucket_bytes):
        # widest elements first: every tensor then starts at a multiple of its element size, which the worker's
        # `.view(dtype)` of its slice needs (vLLM's producer packs in arrival order, where a float32 tensor after
        # an odd-length bfloat16 one would be refused); the worker loads the names in any order
        group = sorted(group, key=lambda i: -tensors[i].element_size())
        fill, sizes = 0, []
        for i in group:
            flat = _flat(tensors[i])
            buffer[fill : fill + flat.numel()].copy_(flat)
            fill += flat.numel()
            sizes.append(flat.numel())
        if buffer.device.type == "cuda":
            torch.cuda.synchronize(buffer.device)  # the worker must see the whole bucket written
        yield {
            "names": [named[i][0] for i in group],
            "dtype_names": [str(tensors[i].dtype).removeprefix("torch.") for i in group],
            "shapes": [list(tensors[i].shape) for i in group],
            "tensor_sizes": sizes,
        }


def buffer_bytes(named: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int) -> int:
    """The staging buffer's size: one bucket, or the largest tensor where that is larger (it goes alone)."""
    return max([bucket_bytes, *(t.numel() * t.element_size() for _, t in named)])


def _releaser(refs: list[torch.Tensor]) -> Callable[[], None]:
    """Drop the tensors the handles point into, then let CUDA reclaim what the worker has let go of: a freed
    staging buffer the worker had mapped waits in torch's IPC limbo until `ipc_collect` (one bucket a publish, else)."""

    def release() -> None:
        cuda = any(t.device.type == "cuda" for t in refs)
        refs.clear()
        if cuda:
            torch.cuda.ipc_collect()

    return release


def ipc_updates(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, share: Share = cuda_handle
) -> tuple[Iterator[dict[str, Any]], Callable[[], None]]:
    """The update_infos of one publish, one `/update_weights` request each, and what to call once the server has
    finished the update (`/finish_weight_update` returned: its layerwise reload reads them up to there), never
    before. `bucket_bytes` 0: one unpacked update (a handle per tensor); else packed buckets in one staging buffer
    on the weights' device, exported once (`share`) so the worker maps it once."""
    if bucket_bytes <= 0:
        info, refs = ipc_update_info(named, share)
        return iter([info]), _releaser(refs)
    named = list(named)
    if not named:
        return iter([]), _releaser([])
    for name, tensor in named:
        if tensor.device != named[0][1].device:
            where = named[0][1].device
            raise ValueError(f"the weights share one staging buffer; {name} is on {tensor.device}, not {where}")
    buffer = torch.empty(buffer_bytes(named, bucket_bytes), dtype=torch.uint8, device=named[0][1].device)  # (bytes,)
    handle = _pickled(share(buffer, "the weights' staging buffer"))
    updates = ({**meta, "ipc_handles_pickled": handle} for meta in pack_buckets(named, bucket_bytes, buffer))
    return updates, _releaser([buffer])
