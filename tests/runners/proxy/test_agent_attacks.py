"""An untrusted agent inside a sandbox (docker, and local in a bubblewrap namespace) attacks everything it can find.

Through its only way out (the relay to the proxy's unix socket) it tries every control route, forges and guesses
session tokens, ends its own and another session with a reward, and sends garbage. Around it, it tries every TCP port
that listens on the host (on loopback and on the host's own addresses: the engine, Ray, any local service), every
unix socket the host has open (paths and abstract names), hrl's state folder where `hrl serve` keeps its control
token, and its own environment. Afterwards only the proxy's data plane answered, no reward, session, weight or
pause state changed, no other trace holds anything it sent, and the proxy still serves."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import uuid
from pathlib import Path

import pytest

from hrl.runners.serving.stack import serving
from hrl.sandboxes import SandboxSpec, get_backend

IMAGE = os.environ.get("HRL_BASE_IMAGE", "hrl/base:bookworm")
CONTROL = "a-control-token-the-agent-never-sees-0123456789"

# What an agent tries around it (run inside its sandbox): every TCP port on every host address, every unix socket
# (paths and abstract names), and the control-token file. Returns (what answered, the file's text or why not).
SCAN = r"""
def scan_everything(scan):
    import socket
    answered = []
    for host in scan["hosts"]:
        for port in scan["ports"]:
            try:
                socket.create_connection((host, port), timeout=1).close()
                answered.append(f"{host}:{port}")
            except OSError:
                pass
    for path in scan["unix"]:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(1)
        try:
            s.connect("\0" + path[1:] if path.startswith("@") else path)
            answered.append(path)
        except OSError:
            pass
        finally:
            s.close()
    try:
        token_file = open(scan["token_file"]).read()
    except OSError as e:
        token_file = type(e).__name__
    return answered, token_file
"""

ATTACK = (
    SCAN
    + r"""
import json, sys, urllib.request
base, mine, victim = "http://127.0.0.1:8000", sys.argv[1], sys.argv[2]
def call(method, path, body=None, headers=None):
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:
        return repr(e)
chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
me = {"Authorization": f"Bearer hrl-{mine}"}
out = {}
for name, (m, p, b) in {
    "list": ("GET", "/sessions", None), "register": ("POST", "/sessions", {"token": "x" * 20}),
    "end_victim": ("POST", f"/s/{victim}/end", {"reward": 1.0}), "end_mine": ("POST", f"/s/{mine}/end", {"reward": 1.0}),
    "publish": ("POST", "/publish", {"path": "/tmp", "kind": "lora"}), "pause": ("POST", "/pause", None),
}.items():
    for who, h in {"anon": {}, "as_agent": me, "guess": {"Authorization": "Bearer control"}}.items():
        out[f"{name}/{who}"] = call(m, p, b, h)
        out[f"{name}/{who}/scoped"] = call(m, f"/s/{mine}{p}", b, h)
out["forged_path"] = call("POST", "/s/" + "A" * 22 + "/v1/chat/completions", chat)
out["forged_key"] = call("POST", "/v1/chat/completions", chat, {"Authorization": "Bearer hrl-" + "B" * 22})
out["no_token"] = call("POST", "/v1/chat/completions", chat)
out["garbage"] = call("POST", f"/s/{mine}/v1/chat/completions", b"\xff{not json", {"Content-Type": "application/json"})
out["bad_field"] = call("POST", f"/s/{mine}/v1/chat/completions", {**chat, "max_tokens": "abc"})
out["own_call"] = call("POST", f"/s/{mine}/v1/chat/completions", chat)
scan = json.loads(sys.argv[3])
out["answered"], out["token_file"] = scan_everything(scan)
print(json.dumps(out))
"""
)


def _listening_ports() -> list[int]:
    """Every TCP port something listens on here (IPv4 and IPv6), from /proc/net."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def _host_addresses() -> list[str]:
    """Loopback and the host's own IPv4 addresses (where a service bound to the node address listens)."""
    addrs = {"127.0.0.1"}
    try:
        addrs |= set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # the address of the default route, if any
        try:
            s.connect(("10.255.255.255", 1))
            addrs.add(s.getsockname()[0])
        except OSError:
            pass
    return sorted(addrs)


def _unix_sockets() -> list[str]:
    """Every unix socket bound here: filesystem paths and abstract names (@name), from /proc/net/unix."""
    names = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8:
            names.add(fields[7])
    return sorted(names)


@pytest.mark.parametrize(
    "backend",
    [pytest.param("docker", marks=pytest.mark.docker), "local"],
)
def test_an_agent_cannot_reach_anything_but_the_proxy_data_plane(tiny_model, backend, monkeypatch):
    from hrl.sandboxes.local import bwrap_works

    if backend == "local":  # as tests/sandboxes/test_isolation.py: the isolation under test needs it, never skipped
        assert bwrap_works(), "bubblewrap is needed (.ci/setup.sh installs it)"
    state = Path.home() / ".cache" / f"hrl-attack-state-{uuid.uuid4().hex[:8]}"  # out of the temp folder on purpose
    state.mkdir(parents=True)
    (state / "control-token").write_text(CONTROL)
    monkeypatch.setenv("HRL_STATE_DIR", str(state))

    # A service on every host address, as an engine or Ray node binds to the node address.
    decoy = socket.create_server(("0.0.0.0", 0))

    async def main():
        async with serving(tiny_model, "scripted", engine_options={"turns": ["ok"]}, control_token=CONTROL) as stack:
            mine = stack.proxy.open_session(meta={"task_id": "attacker"}).token
            victim = stack.proxy.open_session(meta={"task_id": "victim"}).token
            ports = sorted({*_listening_ports(), 8000})  # 8000: where the relay listens inside the sandbox
            scan = {"hosts": _host_addresses(), "ports": ports, "unix": _unix_sockets(),
                    "token_file": str(state / "control-token")}  # fmt: skip
            assert {int(stack.url.rsplit(":", 1)[1]), decoy.getsockname()[1]} <= set(ports), ports
            assert stack.socket in scan["unix"]
            spec = SandboxSpec(image=IMAGE, network="proxy", proxy_socket=stack.socket, proxy_port=8000)
            async with await get_backend(backend).create(spec, f"test-{uuid.uuid4().hex[:8]}", "attacker") as box:
                result = await box.exec(["python3", "-c", ATTACK, mine, victim, json.dumps(scan)], timeout_s=300)
                env = (await box.exec(["env"], timeout_s=30)).stdout
            assert result.exit_code == 0, result
            alive = sorted(stack.proxy.sessions)
            held = not stack.proxy._open.is_set()
            version = stack.engine.version
            traces = {t: stack.proxy.end_session(t, reward=0.0) for t in (mine, victim)}
            return json.loads(result.stdout), alive, traces, env, sorted([mine, victim]), held, version, scan, stack

    try:
        report, alive, traces, env, tokens, held, version, scan, stack = asyncio.run(main())
    finally:
        decoy.close()
        shutil.rmtree(state, ignore_errors=True)
    refused = {k: v for k, v in report.items() if k.split("/")[0] in ("list", "register", "end_victim", "end_mine",
                                                                     "publish", "pause")}  # fmt: skip
    assert all(v in (401, 403, 404) for v in refused.values()), refused
    assert report["forged_path"] == report["forged_key"] == report["no_token"] == 401, report
    assert report["garbage"] == report["bad_field"] == 400, report
    assert report["own_call"] == 200, report
    # Only the relay to the proxy answers: 127.0.0.1:8000 inside the sandbox, and (local) the proxy's own socket.
    print(f"\n{backend}: tried {len(scan['ports'])} ports on {scan['hosts']} and {len(scan['unix'])} unix sockets; "
          f"answered {report['answered']}")  # fmt: skip
    assert set(report["answered"]) <= {"127.0.0.1:8000", stack.socket}, report["answered"]
    assert "127.0.0.1:8000" in report["answered"]
    assert report["token_file"] in ("FileNotFoundError", "PermissionError"), report["token_file"]
    assert CONTROL not in env
    assert alive == tokens  # nobody registered, listed into or ended anything
    assert not held and version == 0  # no pause, no publish
    mine, victim = (traces[t] for t in sorted(traces, key=lambda t: traces[t]["task_id"] != "attacker"))
    assert mine["reward"] == 0.0  # the rewards are the owner's, not the agent's
    assert victim["metadata"]["reward_without_calls"] == 0.0  # (a session without a call is no policy's to reward)
    assert len(mine["calls"]) == 1 and mine["metadata"]["rejected_requests"] == 2
    assert victim["calls"] == [] and "rejected" not in victim
