"""The CUDA-IPC update_info of vLLM's native `ipc` weight-transfer backend, built from the trainer's tensors."""

from __future__ import annotations

import base64
import pickle

import pytest
import torch

from hrl.train.weight_sync import ipc_update_info


def test_cpu_tensors_cannot_travel_by_cuda_ipc():
    with pytest.raises(ValueError, match="CUDA IPC needs CUDA tensors; w is on cpu"):
        ipc_update_info([("w", torch.zeros(2))])


def _rebuild(info: dict, queue) -> None:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    handles = pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    queue.put([rebuild_cuda_tensor(*h[uuid]).cpu() for h in handles])


@pytest.mark.gpu
def test_another_process_rebuilds_the_weights_from_the_handles():
    """What vLLM's worker does with the payload: unpickle, look its GPU up, rebuild each tensor in place."""
    import torch.multiprocessing as mp

    weights = [("a.weight", torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)),
               ("b.bias", torch.arange(7.0, device="cuda"))]  # fmt: skip
    info, keep = ipc_update_info(weights)
    assert info["names"] == ["a.weight", "b.bias"] and info["dtype_names"] == ["bfloat16", "float32"]
    assert info["shapes"] == [[64, 32], [7]]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_rebuild, args=(info, queue))
    proc.start()
    got = queue.get(timeout=120)
    proc.join(60)
    for (_, w), g in zip(weights, got, strict=True):
        assert torch.equal(w.cpu(), g)
    del keep
