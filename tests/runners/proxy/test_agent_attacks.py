"""An untrusted agent inside a Docker sandbox attacks the proxy through its only way out (the relay to the proxy's
unix socket): it tries every control route, forges and guesses session tokens, ends its own and another session
with a reward, and sends garbage. Afterwards no reward changed, no other trace holds anything it sent, and the
proxy still serves."""

from __future__ import annotations

import asyncio
import json
import os
import uuid

import pytest

from hrl.runners.serving.stack import serving
from hrl.sandboxes import SandboxSpec, get_backend

IMAGE = os.environ.get("HRL_BASE_IMAGE", "hrl/base:bookworm")
CONTROL = "a-control-token-the-agent-never-sees-0123456789"

ATTACK = r"""
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
print(json.dumps(out))
"""


@pytest.mark.docker
def test_an_agent_in_docker_cannot_touch_rewards_other_traces_or_the_proxy(tiny_model):
    async def main():
        async with serving(tiny_model, "scripted", engine_options={"turns": ["ok"]}, control_token=CONTROL) as stack:
            mine = stack.proxy.open_session(meta={"task_id": "attacker"}).token
            victim = stack.proxy.open_session(meta={"task_id": "victim"}).token
            spec = SandboxSpec(image=IMAGE, network="proxy", proxy_socket=stack.socket, proxy_port=8000)
            async with await get_backend("docker").create(spec, f"test-{uuid.uuid4().hex[:8]}", "attacker") as box:
                result = await box.exec(["python3", "-c", ATTACK, mine, victim], timeout_s=120)
                env = (await box.exec(["env"], timeout_s=30)).stdout
            assert result.exit_code == 0, result
            alive = sorted(stack.proxy.sessions)
            traces = {t: stack.proxy.end_session(t, reward=0.0) for t in (mine, victim)}
            return json.loads(result.stdout), alive, traces, env, sorted([mine, victim])

    report, alive, traces, env, tokens = asyncio.run(main())
    refused = {k: v for k, v in report.items() if k.split("/")[0] in ("list", "register", "end_victim", "end_mine",
                                                                     "publish", "pause")}  # fmt: skip
    assert all(v in (401, 403, 404) for v in refused.values()), refused
    assert report["forged_path"] == report["forged_key"] == report["no_token"] == 401, report
    assert report["garbage"] == report["bad_field"] == 400, report
    assert report["own_call"] == 200, report
    assert alive == tokens  # nobody registered, listed into or ended anything
    mine, victim = (traces[t] for t in sorted(traces, key=lambda t: traces[t]["task_id"] != "attacker"))
    assert mine["reward"] == victim["reward"] == 0.0  # the rewards are the owner's, not the agent's
    assert len(mine["calls"]) == 1 and mine["metadata"]["rejected_requests"] == 2
    assert victim["calls"] == [] and "rejected" not in victim
    assert CONTROL not in env
