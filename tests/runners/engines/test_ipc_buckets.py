"""weight_sync=ipc with packed buckets: the engine agrees `packed` with the server at start and sends one
/update_weights per bucket between start and finish. A scripted vLLM control plane behind real HTTP records the
requests; the trainer side is the real packer, with only the CUDA-IPC handle faked (no GPU here)."""

from __future__ import annotations

import asyncio
import base64
import pickle
from typing import Any

import pytest
import torch
from aiohttp import web

from hrl.runners.engines.vllm import VLLMEngine, VLLMEngineConfig
from hrl.runners.engines.vllm_contract import FULL_PUBLISH, IPC_FOUR_PHASE
from hrl.train.weight_sync import ipc_updates

MIB = 2**20


def _weights() -> list[tuple[str, torch.Tensor]]:
    """Five float32 tensors of half a MiB (two fill a 1 MiB bucket) and a 2 MiB bfloat16 one that goes alone."""
    torch.manual_seed(0)
    small = [(f"layers.{i}.weight", torch.randn(256, 512)) for i in range(5)]  # (256, 512) float32: 512 KiB each
    return [*small[:2], ("embed.weight", torch.randn(1024, 1024).to(torch.bfloat16)), *small[2:]]


def _fake_share(tensor: torch.Tensor, name: str) -> dict[str, tuple[Any, ...]]:
    return {"cpu": (name, tensor.numel())}  # the CUDA-IPC edge: which buffer, not where it lives


async def _publish(bucket_mb: int, routes: tuple[str, ...] = IPC_FOUR_PHASE) -> list[tuple[str, Any]]:
    """Start an engine on a scripted server, publish the weights once; the (route, JSON body) of every POST."""
    seen: list[tuple[str, Any]] = []
    paths: dict[str, Any] = {r: {"post": {}} for r in (*FULL_PUBLISH, *routes)}
    paths["/reset_prefix_cache"] = {"post": {"parameters": [{"name": "reset_running_requests"}]}}

    async def get(request: web.Request) -> web.Response:
        answers = {"/v1/models": {"data": [{"id": "m", "max_model_len": 64}]}, "/version": {"version": "0.32.0"},
                   "/openapi.json": {"paths": paths}}  # fmt: skip
        return web.json_response(answers[request.path])

    async def post(request: web.Request) -> web.Response:
        seen.append((request.path, await request.json() if request.can_read_body else None))
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/{tail:.*}", get)
    app.router.add_post("/{tail:.*}", post)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    cfg = VLLMEngineConfig(model="m", url=f"http://127.0.0.1:{port}", weight_sync="ipc", ipc_bucket_mb=bucket_mb)
    engine = VLLMEngine(cfg)
    try:
        await engine.start()

        def source(bucket_bytes: int) -> tuple[Any, Any]:
            updates, release = ipc_updates(_weights(), bucket_bytes, share=_fake_share)
            return updates, lambda: (seen.append(("release", None)), release())

        assert engine.attach_weights(source)
        await engine.publish("/unused", "full", 1)
        assert engine.last_publish_tier == "cuda-ipc"
    finally:
        await engine.close()
        await runner.cleanup()
    return seen


def _updates(seen: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    return [body["update_info"] for route, body in seen if route == "/update_weights"]


@pytest.mark.timeout(60)
def test_one_request_per_bucket_between_start_and_finish():
    seen = asyncio.run(_publish(bucket_mb=1))
    assert seen[0] == ("/init_weight_transfer_engine", {"init_info": {"packed": True}})
    routes = [r for r, _ in seen if r.endswith("weight_update") or r in ("/update_weights", "release")]
    updates = _updates(seen)
    # 5 × 512 KiB into 1 MiB buckets: ceil(5 / 2) = 3, exactly filled but the last; the 2 MiB tensor alone: 1 more
    assert len(updates) == -(-5 // 2) + 1 == 4
    # the staging buffer is let go once the server has finished with it, not before
    assert routes == ["/start_weight_update", *["/update_weights"] * 4, "/finish_weight_update", "release"]
    assert [u["names"] for u in updates] == [["layers.0.weight", "layers.1.weight"], ["embed.weight"],
                                             ["layers.2.weight", "layers.3.weight"], ["layers.4.weight"]]  # fmt: skip
    assert updates[1]["tensor_sizes"] == [2 * MIB] and updates[1]["dtype_names"] == ["bfloat16"]
    handles = {u["ipc_handles_pickled"] for u in updates}
    assert len(handles) == 1  # one staging buffer, exported once, sized to the largest tensor (2 MiB > 1 MiB)
    assert pickle.loads(base64.b64decode(handles.pop())) == {"cpu": ("the weights' staging buffer", 2 * MIB)}


@pytest.mark.timeout(60)
def test_bucket_size_0_and_an_update_only_server_send_one_handle_per_tensor():
    unpacked = asyncio.run(_publish(bucket_mb=0))
    older = asyncio.run(_publish(bucket_mb=1, routes=("/init_weight_transfer_engine", "/update_weights")))
    assert unpacked[0] == ("/init_weight_transfer_engine", {"init_info": {"packed": False}})
    assert older[0] == ("/init_weight_transfer_engine", {"init_info": {}})  # the update-only server: no fields
    for seen in (unpacked, older):
        (update,) = _updates(seen)
        assert "tensor_sizes" not in update and len(update["names"]) == 6
        assert len(pickle.loads(base64.b64decode(update["ipc_handles_pickled"]))) == 6  # a list: one per tensor
