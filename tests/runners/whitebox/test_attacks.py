"""A white-box agent that runs model-written code (a Python REPL tool) cannot reach the proxy's control plane.

The same attacker code runs in both modes, the way a REPL tool would run it: in a thread of hrl's own process
(`inprocess`), and inside the agent's process (`subprocess`). It reads the environment (its own, `/proc/self`
and its parent's `/proc/<ppid>/environ`), hrl's control-token file, the session object and every attribute or
dict entry in the process whose name says token, key, secret or auth; then it tries every control route (list,
register, end another session, end its own with a reward, publish, pause, resume) and the agent-key routes on a
session that is not its own, with each credential it found and with none. Everything must be refused (401/403),
and the proxy's sessions, rewards, weights and pause state must be as before; the agent's own sub-agents and
calls still work, and the episode's reward is the verifier's, not the one the attacker gave `session.reward`.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
from pathlib import Path

from hrl.runners.rollouts.episodes import Episode
from hrl.runners.rollouts.rollout import RolloutConfig, make_rollouts
from hrl.runners.serving.stack import serving
from hrl.sandboxes.local import HOST_ENV

CONTROL = "whitebox-attack-control-token-0123456789abcdef"  # planted in hrl's environment, as a user may have it
DECOY = "decoy-cloud-secret-0123456789abcdef"  # a host secret no agent may see
SESSION_VARS = {"OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL", "HRL_URL", "HRL_SESSION_TOKEN", "HRL_MODEL",
                "HRL_AGENT_KEY", "PYTHONPATH"}  # fmt: skip
# Where bubblewrap runs, the agent runs as a local sandbox's command: its own empty HOME, the task's file, the
# sandbox's marks (what kills its leftovers), and the working folder the shell sets.
SANDBOX_VARS = {"HOME", "HRL_TASK_FILE", "HRL_SANDBOX", "HRL_EXEC", "PWD"}

# What the model "wrote": run by the agent's REPL tool, in a thread of the agent's process.
ATTACK = r"""
import gc, json, os, re, urllib.error, urllib.request
from pathlib import Path

import hrl

NAMES = re.compile(r"token|key|secret|passw|auth|cred", re.I)
TOKENISH = re.compile(r"[\x21-\x7e]{8,512}")


def _environ(path):
    try:
        return [kv.partition("=")[2] for kv in Path(path).read_bytes().decode(errors="replace").split("\0")]
    except OSError:
        return []


def candidates(s):
    found = set(os.environ.values()) | set(_environ("/proc/self/environ"))
    found |= set(_environ(f"/proc/{os.getppid()}/environ"))
    state = Path(os.environ.get("HRL_STATE_DIR") or Path.home() / ".local/state/hrl") / "control-token"
    try:
        found.add(state.read_text().strip())
    except OSError:
        pass
    found |= {v for v in vars(s).values() if isinstance(v, str)} | {s.api_key}
    for obj in gc.get_objects():  # every attribute and dict entry named like a credential, anywhere in the process
        try:
            d = obj if type(obj) is dict else vars(obj)
        except Exception:  # no __dict__, or a descriptor that refuses (pydantic's BaseModel class itself)
            continue
        if type(d) is dict:
            for k, v in list(dict.items(d)):
                if isinstance(k, str) and isinstance(v, str) and NAMES.search(k):
                    found.add(v)
    found = {c for c in found if TOKENISH.fullmatch(c)}
    return sorted(found | {c.removeprefix("hrl-") for c in found})


def request(url, method, path, body, credential):
    headers = {"Content-Type": "application/json"}
    if credential is not None:
        headers["Authorization"] = f"Bearer {credential}"
    data = None if method == "GET" else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def attack(victim, me):
    s = hrl.current_session()  # the sub-agent whose block the tool runs in; `me`: the episode's root session
    s.reward(1.0, {"by": "attacker"})
    routes = [("GET", "/sessions", None), ("POST", "/sessions", {}),
              ("POST", "/sessions", {"parent": me, "name": "evil", "trainable": True}),
              ("POST", f"/s/{victim}/end", {"reward": 1.0}), ("POST", f"/s/{me}/end", {"reward": 1.0}),
              ("POST", "/publish", {"path": "/nonexistent", "kind": "lora"}), ("POST", "/pause", {}),
              ("POST", "/resume", {}), ("POST", f"/s/{victim}/children", {"name": "evil"}),
              ("POST", f"/s/{victim}/retire", {}), ("POST", f"/s/{me}/retire", {})]
    creds = candidates(s)
    statuses = {}
    for credential in [None, *creds]:
        for method, path, body in routes:
            code = request(s.url, method, path, body, credential)
            statuses.setdefault(str(code), []).append(f"{method} {path}")
    return {"credentials": creds, "statuses": {k: len(v) for k, v in statuses.items()},
            "accepted": [r for code, rs in statuses.items() if code not in ("401", "403") for r in rs],
            "env": dict(os.environ), "agent_key": s.agent_key, "token": s.token}
"""

AGENT = """
import asyncio, json

ATTACK = {attack!r}


def repl(code, *args):
    ns = {{}}
    exec(code, ns)  # a REPL tool: the model's code, run as it is
    return ns["attack"](*args)


async def run(task, session):
    def say(who):  # distinct bodies: an identical request retried right away replaces the earlier record
        return [{{"role": "user", "content": "hi " + who}}]

    async with session.child("helper", trainable=False) as kid:
        report = await asyncio.to_thread(repl, ATTACK, task.victim, session.token)  # to_thread: hrl.current_session() works there
        await kid.openai().chat.completions.create(model=kid.model, messages=say("kid"), max_tokens=8)  # still open
        async with session.child("helper2") as kid2:  # a new child after the attack
            await kid2.openai().chat.completions.create(model=kid2.model, messages=say("kid2"), max_tokens=8)
    await session.openai().chat.completions.create(model=session.model, messages=say("root"), max_tokens=8)
    report["own_calls"] = "ok"
    session.reward(1.0, {{"report": json.dumps(report)}})  # the recipe's verifier still decides; this is kept aside
    return None
"""


def _attack(model: str, tmp_path: Path, mode: str, control_token: str | None) -> tuple[dict, dict, dict]:
    (tmp_path / "agent.py").write_text(AGENT.format(attack=ATTACK))
    (tmp_path / "verify.py").write_text("def score(task, answer):\n    return 0.25, {'by': 'verifier'}\n")
    report = tmp_path / "report.json"

    async def main() -> tuple[dict, dict]:
        async with serving(model, "scripted", engine_options={"turns": ["ok"]}, control_token=control_token) as stack:
            proxy = stack.proxy
            victim = proxy.open_session(meta={"task_id": "victim"})  # another episode, with its own agent key
            victim.issue_agent_key()
            before = {"version": proxy.engine.version, "publishes": proxy.stats["proxy/publishes"]}
            config = RolloutConfig(agent="agent.py:run", mode=mode)
            verifier = {"name": "python", "function": "verify.py:score"}
            rollouts = make_rollouts(stack, config, verifier=verifier, base_dir=str(tmp_path))
            task = {
                "instance_id": "t",
                "problem_statement": "hi",
                "FAIL_TO_PASS": [],
                "victim": victim.token,
                "report": str(report),
            }
            trace = await rollouts.episode(Episode(task, 0, 0), tmp_path / "traces.jsonl")
            state = {
                "victim_open": victim.token in proxy.sessions,
                "open": sorted(proxy.sessions),
                "finished": [t["session"] for t in proxy.finished],
                "version": proxy.engine.version,
                "publishes": proxy.stats["proxy/publishes"],
                "paused": proxy._held or not proxy._open.is_set(),
                "before": before,
                "victim": victim.token,
            }
            return trace, state

    trace, state = asyncio.run(main())
    assert trace["failure_reason"] is None, trace.get("metadata")
    # The report comes back as what the agent said with its own reward (metadata, never trained on): a subprocess
    # agent runs in a namespace where it can write no host file.
    return trace, state, json.loads(trace["metadata"]["agent_reward_info"]["report"])


def _assert_refused(trace: dict, state: dict, report: dict) -> None:
    assert report["agent_key"] in report["credentials"] and report["token"] in report["credentials"]  # it looked
    assert report["accepted"] == [], report["statuses"]  # every route, every credential: 401 or 403
    assert sum(report["statuses"].values()) == 11 * (1 + len(report["credentials"]))
    assert state["victim_open"] and state["open"] == [state["victim"]]  # only the other episode is still open
    assert state["finished"] == [trace["session"]]  # no other trace was written (the victim's, a forged one)
    assert (state["version"], state["publishes"]) == (state["before"]["version"], state["before"]["publishes"])
    assert not state["paused"]
    assert report["own_calls"] == "ok" and len(trace["calls"]) == 3  # its children and its own calls worked
    assert [a["name"] for a in trace["agents"]] == ["python:agent.py:run", "helper", "helper2"]
    assert trace["reward"] == 0.25 and trace["reward_info"] == {"by": "verifier"}  # the verifier's, not 1.0
    assert trace["metadata"]["agent_reward"] == 1.0


def test_an_inprocess_agents_repl_tool_cannot_reach_the_control_plane(tiny_model, tmp_path, monkeypatch):
    """In process, the agent shares hrl's environment: a control token of another server found there is refused
    here, because a rollout's proxy serves no control routes at all."""
    monkeypatch.setenv("HRL_CONTROL_TOKEN", CONTROL)
    trace, state, report = _attack(tiny_model, tmp_path, "inprocess", control_token=None)
    assert CONTROL in report["credentials"]  # shared with hrl's process: found, and useless
    _assert_refused(trace, state, report)


def test_a_subprocess_agent_gets_an_allowlisted_environment_and_no_control_plane(tiny_model, tmp_path, monkeypatch):
    """The worst case for a subprocess agent: the proxy does serve control routes, and hrl's own environment
    holds their token. The agent's process gets the local sandboxes' allowlist and its session's variables, so
    the token and the host's secrets never reach it."""
    monkeypatch.setenv("HRL_CONTROL_TOKEN", CONTROL)
    monkeypatch.setenv("DECOY_API_KEY", DECOY)
    trace, state, report = _attack(tiny_model, tmp_path, "subprocess", control_token=CONTROL)
    assert CONTROL not in report["credentials"] and DECOY not in report["credentials"]
    extra = {k for k in report["env"] if not any(fnmatch.fnmatchcase(k, p) for p in HOST_ENV)}
    assert extra <= SESSION_VARS | SANDBOX_VARS and {"HRL_AGENT_KEY", "OPENAI_API_KEY"} <= extra, extra
    _assert_refused(trace, state, report)


def test_an_agent_key_opens_children_of_its_own_tree_only(tiny_model):
    """The scoped routes directly: the key opens and retires sub-agents of its own tree (grandchildren too),
    never another tree's, never its root; no key, a wrong key, a session key or the control token: refused."""
    import httpx

    async def main() -> dict:
        async with serving(tiny_model, "scripted", engine_options={"turns": ["ok"]}, control_token=CONTROL) as stack:
            proxy = stack.proxy
            mine, other = proxy.open_session(), proxy.open_session()
            key, other_key = mine.issue_agent_key(), other.issue_agent_key()
            async with httpx.AsyncClient(base_url=stack.url) as http:

                async def post(path: str, bearer: str | None, body: dict | None = None) -> httpx.Response:
                    auth = {} if bearer is None else {"Authorization": f"Bearer {bearer}"}
                    return await http.post(path, json=body or {}, headers=auth)

                kid = (await post(f"/s/{mine.token}/children", key, {"name": "kid"})).json()["token"]
                grandkid = await post(f"/s/{kid}/children", key, {"name": "grandkid", "trainable": False})
                refused = [
                    (await post(f"/s/{mine.token}/children", bearer, {"name": "x"})).status_code
                    for bearer in (None, other_key, f"hrl-{mine.token}", mine.token, CONTROL, "x" * 32)
                ]
                refused.append((await post(f"/s/{other.token}/children", key, {"name": "x"})).status_code)
                refused.append((await post(f"/s/{mine.token}/retire", key)).status_code)  # its own root: hrl's
                refused.append((await post(f"/s/{kid}/retire", other_key)).status_code)
                bad = (await post(f"/s/{mine.token}/children", key, {"name": ""})).status_code
                retired = (await post(f"/s/{kid}/retire", key)).json()
                return {"grandkid": grandkid.status_code, "refused": refused, "bad": bad, "retired": retired,
                        "agents": list(mine.agents), "open": set(proxy.sessions),
                        "mine": mine.token, "other": other.token, "kid": kid}  # fmt: skip

    out = asyncio.run(main())
    assert out["grandkid"] == 201 and out["bad"] == 400
    assert out["refused"] == [401, 403, 403, 403, 403, 403, 403, 403, 403]
    assert out["retired"] == {"agent": "kid", "calls": 0} and out["kid"] not in out["open"]
    assert out["agents"] == [{"name": "kid", "parent": None, "trainable": True},
                             {"name": "grandkid", "parent": "kid", "trainable": False}]  # fmt: skip
    assert {out["mine"], out["other"]} <= out["open"]
