"""A client's sessions on an online run: opened with a client key, ended with or without a reward, rewarded late,
reaped when forgotten; each becomes one trace handed to the trainer, or is recorded and counted as not trained.

The life of a session (docs/online.md):
- `open`: a proxy session owned by the client key; `group` (the client's own name) makes its traces a group.
- `end {reward?, info?}`: with a reward the trace is final; without, `online.scorer` scores it if there is one,
  else the trace waits for `reward` (persisted in `<run>/online/pending.jsonl`, so a resumed run keeps it).
- `reward` within `max_reward_delay_s` of the end, with the trace no staler than `async.max_staleness`: final.
  Later, or staler: `late_reward: drop` records and counts it (`online/late_rewards`), `off_policy` trains it
  anyway, as the async loop trains any token (bounded importance weights) but without the staleness filter.
  A trace whose delay passes without a reward is expired (`online/expired`), kept for a late reward.
- A session with no request for `session_timeout_s` is reaped: its trace goes to `<run>/online/reaped.jsonl`,
  never trained (`online/reaped`).
A group is handed over once none of its sessions is open or waiting for a reward; its expired or reaped members
are left out (it trains short). On a stop, open sessions are saved (`online/open.json`) and restored on resume
under the same tokens, their calls kept, so a client's conversation goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hrl.config import OnlineConfig
from hrl.runners.durable import append_durably, write_atomically
from hrl.runners.errors import ClientError
from hrl.runners.online.keys import KEYS_FILE, ClientKeys
from hrl.runners.proxy.call import CallRecord
from hrl.runners.proxy.proxy import Proxy, UnknownSessionError
from hrl.runners.trace import TraceWriter, binary_success, read_traces, sampled_versions

__all__ = ["OnlineConfig", "OnlineSessions"]

Deliver = Callable[[list[dict[str, Any]]], None]
AGENT_FAILURES = ("agent_crash", "agent_timeout")  # what a client may say of its own agent's end
_KEEP_EXPIRED = 4096  # expired traces kept for a late reward (the oldest go first)


def oldest_version(trace: dict[str, Any]) -> int | None:
    versions = [v for c in trace["calls"] if c.get("versions") for v in sampled_versions(c)]
    return min(versions) if versions else None


class OnlineSessions:
    """The client side of an online run's proxy: see the module docstring. `deliver` gets each final group."""

    def __init__(self, proxy: Proxy, cfg: OnlineConfig, run_path: Path, max_staleness: int, scorer: Any = None) -> None:
        self.proxy, self.cfg, self.max_staleness, self.scorer = proxy, cfg, max_staleness, scorer
        self.keys = ClientKeys(Path(cfg.keys_file) if cfg.keys_file else run_path / KEYS_FILE)
        self.dir = run_path / "online"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.deliver: Deliver = lambda traces: None
        self.owners: dict[str, str] = {}  # open or pending session token -> client name
        self.groups: dict[str, set[str]] = {}  # group id -> its sessions not yet final
        self.finals: dict[str, list[dict[str, Any]]] = {}  # group id -> its final traces, until the group is
        self.pending: dict[str, tuple[dict[str, Any], float]] = {}  # token -> (trace, ended at)
        self.expired: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.counts: Counter[str] = Counter()
        self.reaped: OrderedDict[str, str] = OrderedDict()  # token -> client, for a 410 to a late end
        self.settled: OrderedDict[str, str] = OrderedDict()  # token -> client, for a 409 to a second reward or end
        self._writer = TraceWriter(self.dir / "pending.jsonl")
        self._reaped = TraceWriter(self.dir / "reaped.jsonl")
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._scoring: set[str] = set()
        self._load()

    # ---- the routes -------------------------------------------------------------------------------------------
    def open(self, client: str, body: dict[str, Any]) -> dict[str, Any]:
        if unknown := sorted(set(body) - {"task_id", "group", "metadata"}):  # `parent`, `token`: control-plane fields
            raise ClientError(400, f"POST /sessions with a client key takes task_id, group and metadata; not "
                              f"{', '.join(unknown)} (sub-agents and chosen tokens are for hrl's own control plane)")  # fmt: skip
        task_id, group, metadata = body.get("task_id"), body.get("group"), body.get("metadata") or {}
        if not isinstance(task_id, str | None) or not isinstance(group, str | None) or not isinstance(metadata, dict):
            raise ClientError(400, "POST /sessions takes {task_id?: str, group?: str, metadata?: object}")
        if sum(c == client for t, c in self.owners.items() if t in self.proxy.sessions) >= self.cfg.max_open_per_key:
            raise ClientError(429, f"client {client} has {self.cfg.max_open_per_key} sessions open, the most it may")
        group_id = f"online:{client}:{group}" if group else f"online:{uuid.uuid4().hex[:12]}"  # one per client
        meta = {"task_id": task_id, "group_id": group_id, "agent": {"name": client},
                "model": {"name": self.proxy.config.model_name},
                "metadata": {**metadata, "online": {"client": client, "group": group}}}  # fmt: skip
        session = self.proxy.open_session(meta=meta)
        self.owners[session.token] = client
        self.groups.setdefault(group_id, set()).add(session.token)
        self.counts["online/opened"] += 1
        return {"token": session.token}

    def _owned(self, client: str, token: str) -> None:
        """Refuse a token this client does not own with the answer an unknown one gets: no key learns of others."""
        if self.reaped.get(token) == client:
            raise ClientError(410, f"session {token} was reaped: no request for online.session_timeout_s")
        if self.settled.get(token) == client and token not in self.owners:
            raise ClientError(409, f"session {token} has its reward already")
        if self.owners.get(token) != client:
            raise ClientError(404, f"no session {token} of this client key")

    async def end(self, client: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
        self._owned(client, token)
        if token not in self.proxy.sessions:
            raise ClientError(409, f"session {token} has ended already")
        reward, info = _reward(body, required=False)
        failure = body.get("failure_reason")
        if failure is not None and failure not in AGENT_FAILURES:
            raise ClientError(400, f"'failure_reason' is one of {', '.join(AGENT_FAILURES)}, or absent")
        try:
            trace = self.proxy.end_session(
                token, reward=reward, reward_info=info, failure_reason=failure, extra={"ended_by": "client"}
            )
        except UnknownSessionError as e:
            raise ClientError(409, f"session {token} has ended already") from e
        self.counts["online/ended"] += 1
        if reward is None and self.scorer is not None:
            self._scoring.add(token)  # ended, not yet pending: not for the reaper
            try:
                reward, info = await self._score(trace, info)
            finally:
                self._scoring.discard(token)
        if reward is not None:
            self._final(token, _rewarded(trace, reward, info))
            return {"trace_id": trace["trace_id"], "status": "final", "calls": len(trace["calls"])}
        self.pending[token] = (trace, time.time())
        self._writer.write(trace)
        return {"trace_id": trace["trace_id"], "status": "waiting for reward", "calls": len(trace["calls"]),
                "reward_by": round(time.time() + self.cfg.max_reward_delay_s, 3)}  # fmt: skip

    def reward(self, client: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
        self._owned(client, token)
        reward, info = _reward(body, required=True)
        if token in self.pending:
            trace, ended = self.pending.pop(token)
            late = time.time() - ended > self.cfg.max_reward_delay_s or self._stale(trace)
            if not late:
                self.counts["online/delayed_rewards"] += 1
                self._event("settled", token)
                group_id = str(trace["group_id"])
                self._final(token, _rewarded(trace, reward, info))
                # accepted; trained once its group is whole: "trained" says whether it went to training now
                waiting = len(self.groups.get(group_id, ()))
                return {"trace_id": trace["trace_id"], "accepted": True, "trained": not waiting,
                        **({"group_waits_for": waiting} if waiting else {})}  # fmt: skip
            self._event("expired", token)
            self._expire(token, trace)
        if token not in self.expired:
            if token in self.proxy.sessions:
                raise ClientError(409, f"session {token} is open: end it first (its end may carry the reward)")
            raise ClientError(409, f"session {token} has its reward already, or was reaped")
        trace = self.expired.pop(token)
        self._forget(token)
        self.counts["online/late_rewards"] += 1
        self._event("settled", token)
        if self.cfg.late_reward == "drop":
            return {"trace_id": trace["trace_id"], "trained": False, "late": True}
        off = _rewarded(trace, reward, info)
        off["metadata"]["online"]["off_policy"] = True
        self.counts["online/off_policy"] += 1
        self.deliver([off])
        return {"trace_id": trace["trace_id"], "trained": True, "late": True}

    # ---- final, expired, reaped ---------------------------------------------------------------------------------
    def _stale(self, trace: dict[str, Any]) -> bool:
        oldest = oldest_version(trace)
        return oldest is not None and oldest < self.proxy.engine.version - self.max_staleness

    def _final(self, token: str, trace: dict[str, Any]) -> None:
        self._forget(token)
        self.finals.setdefault(str(trace["group_id"]), []).append(trace)
        self._settle(token, str(trace["group_id"]))

    def _forget(self, token: str) -> None:
        """`token` has its reward: its owner is told so (409) by its next end or reward, while it is among the last
        _KEEP_EXPIRED remembered."""
        if (client := self.owners.pop(token, None)) is not None:
            self.settled[token] = client
            while len(self.settled) > _KEEP_EXPIRED:
                self.settled.popitem(last=False)

    def _settle(self, token: str, group_id: str) -> None:
        """`token` is final (or left out): its group is handed over once none of it is open or pending."""
        members = self.groups.get(group_id, set())
        members.discard(token)
        if not members:
            self.groups.pop(group_id, None)
            if traces := self.finals.pop(group_id, []):
                self.deliver(traces)

    def _expire(self, token: str, trace: dict[str, Any]) -> None:
        self.expired[token] = trace
        while len(self.expired) > _KEEP_EXPIRED:
            old, _ = self.expired.popitem(last=False)
            self.owners.pop(old, None)
        self._settle(token, str(trace["group_id"]))

    def sweep(self, now: float | None = None) -> None:
        """Expire traces whose reward is overdue; reap sessions idle past session_timeout_s (or ended by the proxy
        itself: its own idle timeout, a stop)."""
        now = time.time() if now is None else now
        for token, (trace, ended) in list(self.pending.items()):
            if now - ended > self.cfg.max_reward_delay_s:
                del self.pending[token]
                self.counts["online/expired"] += 1
                self._event("expired", token)
                self._expire(token, trace)
        waiting = self.pending.keys() | self.expired.keys() | self._scoring
        for token in [t for t in self.owners if t not in waiting]:
            session = self.proxy.sessions.get(token)
            if session is not None and now - session.last_active <= self.cfg.session_timeout_s:
                continue
            trace = None
            if session is not None:
                trace = self.proxy.end_session(token, extra={"ended_by": "online reaper"})
                self._reaped.write(trace)
            self.reaped[token] = self.owners.pop(token)
            while len(self.reaped) > _KEEP_EXPIRED:
                self.reaped.popitem(last=False)
            self.counts["online/reaped"] += 1
            group = trace["group_id"] if trace else next((g for g, m in self.groups.items() if token in m), "")
            self._settle(token, str(group))

    async def _sweeping(self) -> None:
        period = max(0.05, min(self.cfg.max_reward_delay_s, self.cfg.session_timeout_s) / 4)
        while True:
            await asyncio.sleep(min(period, 5.0))
            self.sweep()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sweeping())

    async def _score(self, trace: dict[str, Any], info: dict[str, Any]) -> tuple[float | None, dict[str, Any]]:
        """`online.scorer` on a trace ended without a reward; a scorer that fails leaves it waiting, counted."""
        try:
            out = self.scorer(trace, info)
            if asyncio.iscoroutine(out):
                out = await out
            if out is None:  # the scorer cannot say: the trace waits for the client's reward
                return None, info
            reward, extra = out if isinstance(out, tuple) else (out, {})
            self.counts["online/scored"] += 1
            return float(reward), {**info, **(extra or {}), "scorer": True}
        except Exception as e:
            self.counts["online/scorer_errors"] += 1
            return None, {**info, "scorer_error": f"{type(e).__name__}: {e}"[:500]}

    # ---- a stop and a resume --------------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        return {**{k: float(v) for k, v in self.counts.items()}, "online/open": float(
            sum(t in self.proxy.sessions for t in self.owners)), "online/pending": float(len(self.pending))}  # fmt: skip

    def _event(self, kind: str, token: str) -> None:
        append_durably(self.dir / "events.jsonl", (json.dumps({"ev": kind, "session": token}) + "\n").encode())

    async def close(self) -> None:
        """Stop the sweeper and save the open sessions (calls and all) for a resumed run to take up."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        saved = []
        for token, client in self.owners.items():
            s = self.proxy.sessions.get(token)
            if s is None or s.root is not s:
                continue
            saved.append({"token": token, "client": client, "meta": s.meta, "started_at": s.started_at,
                          "calls": [dataclasses.asdict(c) for c in s.calls if c.ended_at is not None]})  # fmt: skip
            self.proxy.sessions.pop(token)  # not ended: it goes on in the resumed run
        write_atomically(self.dir / "open.json", json.dumps({"sessions": saved, "counts": dict(self.counts)}))

    def _load(self) -> None:
        """A resumed run: the pending traces (less those settled), the expired ones, the open sessions saved."""
        events = _events(self.dir / "events.jsonl")
        traces = read_traces(self.dir / "pending.jsonl") if (self.dir / "pending.jsonl").is_file() else []
        for t in traces:
            token, state = t["session"], events.get(t["session"])
            if state == "settled":
                continue
            self.owners[token] = t["metadata"]["online"]["client"]
            if state == "expired":
                self.expired[token] = t
            else:
                self.pending[token] = (t, float(t["ended_at"]))
                self.groups.setdefault(str(t["group_id"]), set()).add(token)
        path = self.dir / "open.json"
        saved = json.loads(path.read_text()) if path.is_file() else {"sessions": [], "counts": {}}
        self.counts.update(saved.get("counts") or {})
        for s in saved["sessions"]:
            session = self.proxy.open_session(s["token"], s["meta"])
            session.started_at = s["started_at"]
            session.calls.extend(_record(c) for c in s["calls"])
            self.owners[s["token"]] = s["client"]
            self.groups.setdefault(str(s["meta"]["group_id"]), set()).add(s["token"])
        path.unlink(missing_ok=True)


def _reward(body: dict[str, Any], *, required: bool) -> tuple[float | None, dict[str, Any]]:
    reward, info = body.get("reward"), body.get("info") or {}
    if reward is None and not required:
        pass
    elif isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise ClientError(400, "'reward' must be a finite number")
    if not isinstance(info, dict):
        raise ClientError(400, "'info' must be an object")
    return (None if reward is None else float(reward)), info


def _rewarded(trace: dict[str, Any], reward: float, info: dict[str, Any]) -> dict[str, Any]:
    info = {**(trace.get("reward_info") or {}), **info}
    metadata = {**trace["metadata"], "online": dict(trace["metadata"].get("online") or {})}
    return {**trace, "reward": reward, "reward_info": info, "success": binary_success(reward, info),
            "metadata": metadata}  # fmt: skip


def _record(d: dict[str, Any]) -> CallRecord:
    d = dict(d)
    d["versions"] = [tuple(v) for v in d.get("versions") or []]
    return CallRecord(**d)


def _events(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue  # a last line cut by a crash
            if out.get(e["session"]) != "settled":
                out[e["session"]] = e["ev"]
    return out
