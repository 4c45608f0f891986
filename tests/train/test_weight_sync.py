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


# ---- packed buckets ------------------------------------------------------------------------------------------
BUCKET = 256  # bytes


class _Tiny(torch.nn.Module):
    """A state dict laid out so that every bucket but the last is filled exactly (see test_bucket_count)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 8, bias=False)  # a.weight float32 (8, 8): 256 B, one bucket
        self.b = torch.nn.Linear(8, 8, bias=False).to(torch.bfloat16)  # b.weight bfloat16 (8, 8): 128 B
        self.count = torch.nn.Module()
        self.count.register_buffer("steps", torch.arange(16) * 2**40 + 7)  # int64 (16,): 128 B, all 8 bytes used
        self.embed = torch.nn.Embedding(32, 8, dtype=torch.bfloat16)  # (32, 8): 512 B, larger than a bucket
        self.norm = torch.nn.Module()
        # one bucket: 2 + 252 + 2 B. Packed in this order, the float32 tensor would start at byte 2, which vLLM's
        # unpack cannot view as float32 (a view's offset must be a multiple of its element size)
        self.norm.scale = torch.nn.Parameter(torch.tensor(-0.3, dtype=torch.bfloat16))  # 0-d bfloat16: 2 B
        self.norm.weight = torch.nn.Parameter(torch.randn(63))  # float32 (63,): 252 B
        self.norm.shift = torch.nn.Parameter(torch.tensor(0.7, dtype=torch.bfloat16))  # 0-d bfloat16: 2 B
        self.tail = torch.nn.Linear(10, 1, bias=False).to(torch.bfloat16)  # (1, 10): 20 B, the last bucket


def _state() -> list[tuple[str, torch.Tensor]]:
    return [(k, v.detach()) for k, v in _Tiny().state_dict().items()]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def test_bucket_count_is_the_arithmetic_ceil_and_an_oversized_tensor_goes_alone():
    from hrl.train.weight_sync import bucket_groups

    state = _state()
    sizes = [t.numel() * t.element_size() for _, t in state]
    small = sum(n for n in sizes if n <= BUCKET)  # 788 B; packed without a gap (the layout of _Tiny)
    big = [i for i, n in enumerate(sizes) if n > BUCKET]
    groups = bucket_groups(sizes, BUCKET)
    assert len(groups) == -(-small // BUCKET) + len(big) == 5
    assert [[state[i][0] for i in g] for g in groups if set(g) & set(big)] == [["embed.weight"]]
    assert all(sum(sizes[i] for i in g) <= BUCKET for g in groups if not set(g) & set(big))
    assert sorted(i for g in groups for i in g) == list(range(len(state)))  # each tensor once, in order
    assert bucket_groups(sizes, 10**9) == [list(range(len(state)))]  # one bucket holds them all


def test_cpu_tensors_cannot_travel_packed_either():
    from hrl.train.weight_sync import ipc_updates

    with pytest.raises(ValueError, match="CUDA IPC needs CUDA tensors"):
        ipc_updates(_state(), BUCKET)


def _fake_share(tensor: torch.Tensor, name: str) -> dict[str, tuple]:
    return {"cpu": (name, tensor.numel())}  # the CUDA-IPC edge, faked: what the buffer is, not where


def test_one_update_per_bucket_one_buffer_exported_once():
    from hrl.train.weight_sync import buffer_bytes, ipc_updates

    state = _state()
    updates, release = ipc_updates(state, BUCKET, share=_fake_share)
    infos = list(updates)
    assert len(infos) == 5 and buffer_bytes(state, BUCKET) == 512
    assert len({i["ipc_handles_pickled"] for i in infos}) == 1  # the worker maps the staging buffer once
    handle = pickle.loads(base64.b64decode(infos[0]["ipc_handles_pickled"]))
    assert handle == {"cpu": ("the weights' staging buffer", 512)}  # a dict, not a list: vLLM's packed form
    assert sorted(n for i in infos for n in i["names"]) == sorted(k for k, _ in state)  # each once
    assert infos[3]["names"] == ["norm.weight", "norm.scale", "norm.shift"]  # float32 first: offsets 0, 252, 254
    release()
    unpacked, release = ipc_updates(state, 0, share=_fake_share)
    (info,) = list(unpacked)
    assert "tensor_sizes" not in info and len(info["names"]) == len(state)
    release()


def _packed(state: list[tuple[str, torch.Tensor]]) -> list[tuple[dict, bytes]]:
    """Each bucket's metadata and the bytes the worker would read from the staging buffer when it arrives."""
    from hrl.train.weight_sync import buffer_bytes, pack_buckets

    buffer = torch.zeros(buffer_bytes(state, BUCKET), dtype=torch.uint8)
    return [(meta, buffer[: sum(meta["tensor_sizes"])].numpy().tobytes()) for meta in pack_buckets(state, BUCKET, buffer)]  # fmt: skip


# vLLM's receiving side for a packed bucket, minus the CUDA rebuild: packed_ipc_consumer's own steps (trim to the
# content, dtypes by name, unpack_tensor). packed_tensor.py is loaded by its file: it imports only torch, and the
# vllm package's import would take seconds.
UNPACK = r"""
import importlib.util, json, pathlib, sys, torch
from safetensors.torch import save_file
root = pathlib.Path(importlib.util.find_spec("vllm").origin).parent
spec = importlib.util.spec_from_file_location("packed_tensor", root / "distributed/weight_transfer/packed_tensor.py")
pt = importlib.util.module_from_spec(spec); spec.loader.exec_module(pt)
work = pathlib.Path(sys.argv[1])
out = {}
for i, meta in enumerate(json.loads((work / "meta.json").read_text())):
    packed = torch.frombuffer(bytearray((work / f"{i}.bin").read_bytes()), dtype=torch.uint8)
    packed = packed[: sum(meta["tensor_sizes"])]
    dtypes = [getattr(torch, d) for d in meta["dtype_names"]]
    for name, t in pt.unpack_tensor(packed, meta["names"], meta["shapes"], dtypes, meta["tensor_sizes"]):
        out[name] = t.clone()
save_file(out, str(work / "out.safetensors"))
"""


@pytest.mark.vllm
def test_vllms_unpack_gives_every_tensor_back_bit_for_bit(tmp_path):
    import json
    import os
    import subprocess

    from safetensors.torch import load_file

    state = _state()
    buckets = _packed(state)
    (tmp_path / "meta.json").write_text(json.dumps([m for m, _ in buckets]))
    for i, (_, raw) in enumerate(buckets):
        (tmp_path / f"{i}.bin").write_bytes(raw)
    python = os.environ["HRL_VLLM_PYTHON"]
    subprocess.run([python, "-c", UNPACK, str(tmp_path)], check=True, timeout=120)
    got = load_file(str(tmp_path / "out.safetensors"))
    assert sorted(got) == sorted(k for k, _ in state)
    for name, want in state:
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        assert torch.equal(_bytes(got[name]), _bytes(want)), name


def _packed_worker(jobs, results) -> None:
    """What vLLM's worker does with packed updates (packed_ipc_consumer), in torch alone: map the staging buffer
    once, then per bucket split it by tensor_sizes, view each piece as its dtype and shape, copy it out."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    uuid, buffer = str(torch.cuda.get_device_properties(0).uuid), None
    while (info := jobs.get()) is not None:
        if buffer is None:
            args = list(pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))[uuid])
            args[6] = 0  # the worker's device index
            buffer = rebuild_cuda_tensor(*args)
        pieces = buffer[: sum(info["tensor_sizes"])].split(info["tensor_sizes"])
        dtypes = [getattr(torch, d) for d in info["dtype_names"]]
        got = [p.view(d).view(s).cpu() for p, d, s in zip(pieces, dtypes, info["shapes"], strict=True)]
        results.put(list(zip(info["names"], got, strict=True)))  # the ack: the producer may pack the next bucket


@pytest.mark.gpu
def test_another_process_unpacks_every_bucket_from_the_one_buffer():
    import torch.multiprocessing as mp

    from hrl.train.weight_sync import ipc_updates

    state = [(k, v.cuda()) for k, v in _state()]
    updates, release = ipc_updates(state, BUCKET)
    ctx = mp.get_context("spawn")
    jobs, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_packed_worker, args=(jobs, results))
    proc.start()
    got: dict[str, torch.Tensor] = {}
    for info in updates:  # the next bucket overwrites the buffer only after the worker has answered
        jobs.put(info)
        got |= dict(results.get(timeout=120))
    jobs.put(None)
    proc.join(60)
    assert sorted(got) == sorted(k for k, _ in state)
    for name, want in state:
        assert got[name].dtype == want.dtype and torch.equal(_bytes(got[name]), _bytes(want.cpu())), name
    release()
