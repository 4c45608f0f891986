"""`engine_app` answers only to its bearer token: every route, with no credential, a guessed one, an agent's
`hrl-<token>` key or a near miss of the real one, is a 401 that changes nothing (no version, pause or abort state);
with the token, `RemoteEngine` drives it as before. The Ray placement's attack test, across nodes, is
`tests/runners/test_placement.py::test_an_outsider_cannot_drive_any_replica`."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import aiohttp
import pytest

from hrl.runners.engines.base import SamplingParams
from hrl.runners.engines.remote import RemoteEngine, RemoteEngineConfig, engine_app, serve_engine
from hrl.runners.engines.scripted import ScriptedEngine, ScriptedEngineConfig
from hrl.runners.errors import EngineStartError, UsageError

pytestmark = pytest.mark.timeout(120)

# Every route engine_app serves, with a body that would act if it were let through, and one it does not serve.
ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/generate", {"request_id": "outsider", "prompt_ids": [1, 2, 3], "params": {"max_tokens": 8}}),
    ("POST", "/abort", {"request_id": "held"}),
    ("POST", "/pause", {}),
    ("POST", "/resume", {}),
    ("POST", "/publish", {"path": "/tmp/not-a-checkpoint", "kind": "full", "version": 99}),
    ("GET", "/health", None),
    ("GET", "/metrics", None),
    ("POST", "/no-such-step", {}),
]


def _credentials(token: str) -> dict[str, dict[str, str]]:
    """What an outsider might send: nothing, a guess, an agent's session key, and near misses of the token."""
    return {
        "none": {},
        "guessed": {"Authorization": "Bearer " + secrets.token_urlsafe(32)},
        "agent key": {"Authorization": "Bearer hrl-" + secrets.token_urlsafe(16)},
        "agent key as api key": {"X-Api-Key": "hrl-" + secrets.token_urlsafe(16)},
        "token without Bearer": {"Authorization": token},
        "token cut short": {"Authorization": "Bearer " + token[:-1]},
        "token with more": {"Authorization": "Bearer " + token + "x"},
        "another scheme": {"Authorization": "Basic " + token},
    }


async def _attack(url: str, token: str) -> dict[str, int]:
    """Every route with every wrong credential; returns 'METHOD path (credential)' -> status."""
    codes: dict[str, int] = {}
    async with aiohttp.ClientSession() as http:
        for name, headers in _credentials(token).items():
            for method, path, body in ROUTES:
                async with http.request(method, url + path, json=body, headers=headers) as r:
                    text = await r.text()
                    assert token not in text
                    codes[f"{method} {path} ({name})"] = r.status
    return codes


def test_engine_app_refuses_every_route_without_its_token_and_serves_with_it(tiny_model):
    token = secrets.token_urlsafe(32)
    engine = ScriptedEngine(ScriptedEngineConfig(model=tiny_model, turns=["Done."]))
    params = SamplingParams(max_tokens=16)

    async def main() -> None:
        runner, url = await serve_engine(engine, token=token)
        good = RemoteEngine(RemoteEngineConfig(url=url, token=token))
        try:
            await good.start()
            await good.pause()  # a generation held mid-flight: an outsider's resume or abort would show on it

            async def held() -> list[Any]:
                return [d async for d in good.generate("held", [1, 2, 3], params)]

            job = asyncio.create_task(held())
            for _ in range(6000):  # until it reached the engine and waits there, paused
                if "held" in engine._running:
                    break
                await asyncio.sleep(0.01)

            codes = await _attack(url, token)
            assert set(codes.values()) == {401}, {k: v for k, v in codes.items() if v != 401}
            assert len(codes) == len(ROUTES) * len(_credentials(token))
            assert engine.version == 0
            assert not engine._paused.is_set()  # still paused: no outsider resumed it
            assert engine._aborted == set() and "held" in engine._running and not job.done()

            await good.resume()
            deltas = await job
            assert deltas[-1].finish_reason == "stop"  # played out whole, not aborted

            codes = await _attack(url, token)  # now running: an outsider's pause must not stop it
            assert set(codes.values()) == {401}
            assert engine._paused.is_set() and engine.version == 0
            again = [d async for d in good.generate("again", [1, 2, 3], params)]
            assert [d.token_ids for d in again] == [d.token_ids for d in deltas]

            assert await good.publish("unused", "lora") == 1 == engine.version
            assert await good.health()
            assert (await good.read_metrics()) == (await engine.read_metrics())  # the engine's own, through the token

            stranger = RemoteEngine(RemoteEngineConfig(url=url, token=secrets.token_urlsafe(32), startup_timeout_s=600))
            with pytest.raises(EngineStartError, match="refused this run's token"):
                await stranger.start()  # at once: a wrong token is not retried until the startup timeout
        finally:
            await good.close()
            await runner.cleanup()
            await engine.close()

    asyncio.run(main())


@pytest.mark.parametrize("token", ["", "short", "x" * 31])
def test_an_engine_server_needs_a_token_that_is_a_secret(tiny_model, token):
    engine = ScriptedEngine(ScriptedEngineConfig(model=tiny_model))
    with pytest.raises(UsageError, match="at least 32 characters"):
        engine_app(engine, token)
    with pytest.raises(UsageError):
        asyncio.run(serve_engine(engine, token=token))
    assert engine.version == 0


@pytest.mark.parametrize(
    "image",
    [
        {"data": "not base64!", "mime": "image/png", "sha256": "0" * 64},
        {"data": "aGVsbG8=", "mime": "image/png"},  # no sha256
        {"data": "aGVsbG8=", "mime": "image/png", "sha256": "0" * 64},  # bytes that are not the sha256's
        "aGVsbG8=",  # not an object
    ],
    ids=["bad-base64", "no-sha256", "wrong-sha256", "not-an-object"],
)
def test_a_malformed_image_is_a_400_naming_it_not_a_500(tiny_model, image):
    """Even the run's own token holder (a proxy shard with a bug) gets a 400 that says what is wrong with an image."""
    token = secrets.token_urlsafe(32)
    engine = ScriptedEngine(ScriptedEngineConfig(model=tiny_model, turns=["Done."]))
    body = {"request_id": "img", "prompt_ids": [1, 2, 3], "params": {"max_tokens": 8}, "images": [image]}

    async def main() -> tuple[int, str]:
        runner, url = await serve_engine(engine, token=token)
        try:
            async with aiohttp.ClientSession() as http:
                headers = {"Authorization": f"Bearer {token}"}
                async with http.post(url + "/generate", json=body, headers=headers) as r:
                    return r.status, await r.text()
        finally:
            await runner.cleanup()
            await engine.close()

    status, text = asyncio.run(main())
    assert status == 400 and "image" in text, (status, text)
