"""The `vllm serve` command line and environment of the GPU fields (no server: these only build the spawn)."""

from __future__ import annotations

import pytest

from hrl.runners.engines.vllm import VLLMEngine, VLLMEngineConfig
from hrl.runners.engines.vllm_server import gpu_flags, server_env


def test_gpu_fields_become_vllm_flags_only_when_set():
    assert gpu_flags(VLLMEngineConfig(model="m")) == []
    cfg = VLLMEngineConfig(model="m", tensor_parallel_size=4, gpu_memory_utilization=0.45, max_num_seqs=128,
                           enable_prefix_caching=True, sleep_level=1, dtype="bfloat16")  # fmt: skip
    flags = gpu_flags(cfg)
    assert flags == ["--tensor-parallel-size", "4", "--gpu-memory-utilization", "0.45", "--max-num-seqs", "128",
                     "--enable-prefix-caching", "--enable-sleep-mode"]  # fmt: skip
    cmd = VLLMEngine(cfg)._command("python", "/models/m", ["--uds", "/tmp/x/vllm.sock"])
    assert cmd[-len(flags) :] == flags  # extra_args, when any, still come last
    off = gpu_flags(VLLMEngineConfig(model="m", enable_prefix_caching=False))
    assert off == ["--no-enable-prefix-caching"]


def test_split_layout_gives_the_server_its_own_gpus():
    assert server_env(1, [4, 5, 6, 7])["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert server_env(1).get("CUDA_VISIBLE_DEVICES") == __import__("os").environ.get("CUDA_VISIBLE_DEVICES")


def test_sleep_level_is_0_1_or_2():
    with pytest.raises(ValueError, match="sleep_level"):
        VLLMEngineConfig(model="m", sleep_level=3)


def test_ipc_weight_sync_turns_on_the_native_transfer_api_and_only_then():
    cfg = VLLMEngineConfig(model="m", weight_sync="ipc")
    assert gpu_flags(cfg)[-2:] == ["--weight-transfer-config", '{"backend": "ipc"}']
    assert server_env(1, ipc=True)["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    unset = server_env(1).get("VLLM_ALLOW_INSECURE_SERIALIZATION")
    assert unset == __import__("os").environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION")  # disk: as the caller has it
    assert VLLMEngine(cfg).attach_weights(lambda: ({}, [])) is True
    assert VLLMEngine(VLLMEngineConfig(model="m")).attach_weights(lambda: ({}, [])) is False  # disk: ignored


def test_a_control_call_survives_a_server_closing_its_pooled_connection():
    """A server that closes a connection as a request arrives on it (an idle keep-alive it is timing out): the call
    goes once more on a new connection. A server that keeps doing so fails the call with an EngineError."""
    import asyncio

    from hrl.runners.engines.vllm_server import new_session
    from hrl.runners.errors import EngineError

    async def go(drops: int) -> tuple[object, int]:
        seen = 0

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal seen
            await reader.readuntil(b"\r\n\r\n")
            seen += 1
            if seen <= drops:
                writer.close()  # no response at all
                return
            body = b'{"is_sleeping": true}'
            head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            writer.write(head.encode() + body)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        engine = VLLMEngine(VLLMEngineConfig(model="m", url=f"http://127.0.0.1:{port}"))
        engine._http = new_session()
        try:
            return await engine._call("POST", "/sleep"), seen  # a POST: aiohttp resends only idempotent methods
        except EngineError as e:
            return e, seen
        finally:
            await engine._http.close()
            server.close()

    assert asyncio.run(go(drops=1)) == ({"is_sleeping": True}, 2)
    failed, seen = asyncio.run(go(drops=5))
    assert isinstance(failed, EngineError) and "Server disconnected" in str(failed) and seen == 2
