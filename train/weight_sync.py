"""Full weights to a colocated vLLM without the disk: the trainer's CUDA tensors handed over by CUDA IPC, in the
update format of vLLM's native `ipc` weight-transfer backend (`/update_weights`; vLLM ≥ 0.32). Only torch here: the
trainer's environment has no vLLM."""

from __future__ import annotations

import base64
import pickle
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["ipc_update_info"]


def ipc_update_info(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """vLLM's unpacked IPC update_info for these CUDA tensors (HF names), with the handles pickled and base64-encoded
    as its HTTP route takes them (the server needs VLLM_ALLOW_INSECURE_SERIALIZATION=1), and the tensors the handles
    point into: keep them alive until the engine has finished the update."""
    from torch.multiprocessing.reductions import reduce_tensor

    names, dtypes, shapes, handles, refs = [], [], [], [], []
    for name, tensor in named:
        weight = tensor.detach().contiguous()
        if weight.device.type != "cuda":
            raise ValueError(f"CUDA IPC needs CUDA tensors; {name} is on {weight.device}")
        uuid = str(torch.cuda.get_device_properties(weight.device).uuid)  # the worker looks its own GPU up here
        names.append(name)
        dtypes.append(str(weight.dtype).removeprefix("torch."))
        shapes.append(list(weight.shape))
        handles.append({uuid: reduce_tensor(weight)[1]})
        refs.append(weight)
    pickled = base64.b64encode(pickle.dumps(handles)).decode()
    return {"names": names, "dtype_names": dtypes, "shapes": shapes, "ipc_handles_pickled": pickled}, refs
