"""Sessions: the calls of one rollout, token-in/token-out prompt building, and the trace they become.

The guarantee: when a request's messages extend an earlier call of the same session (the earlier messages,
then the assistant reply the proxy produced, then new messages), its prompt ids are that call's prompt ids +
sampled ids, verbatim, + the tokenization of only the new text. Anything else (compaction, an edited earlier
turn, another system prompt) starts a new branch, tokenized whole.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from hrl.errors import HrlError
from hrl.runners.proxy.call import Call, CallRecord, PromptPlan
from hrl.runners.proxy.dialects.base import ChatRequest, media_counts
from hrl.runners.proxy.otel_in import ReceivedTools, merge_tools
from hrl.runners.proxy.template import IMAGE_MARK, ChatTemplate, ParsedReply
from hrl.runners.trace import INFRA_FAILURES, SCHEMA, binary_success

__all__ = ["Call", "CallRecord", "ChildLimitError", "ChildSession", "PromptPlan", "Session"]

_Rendered = tuple[list[dict[str, Any]], str, str]
UNSAID: Any = object()  # `to_trace(success=…)` not given: read from the reward
_SIDE_MARKERS = ("title generator", "generate a title", "generate a short title", "memory extraction")


class ChildLimitError(HrlError):
    """A session asked for one sub-agent more than `proxy.max_children` allows (answered with a 429)."""


class SessionBusyError(HrlError):
    """A session's tree already has `proxy.max_queued_prompts` requests reading or tokenizing, or waiting to (answered
    with a 429): one client's flood is refused at once instead of held in memory."""


def _digest(obj: Any) -> str:
    return hashlib.blake2b(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode(), digest_size=12).hexdigest()


def _canonical_args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments.strip()
    return arguments


def message_key(m: dict[str, Any]) -> str:
    """What the template renders of a message (ids and formatting of tool arguments left out)."""
    calls = [
        (c["function"]["name"], _canonical_args(c["function"].get("arguments"))) for c in m.get("tool_calls") or []
    ]
    content = m.get("content") or ""
    return _digest([m["role"], content.strip() if m["role"] == "assistant" else content, calls])


def reply_key(reply: ParsedReply) -> str:
    msg = {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls}
    return message_key(msg)


class Session:
    """One rollout's conversation(s) with the model; becomes one `hrl.trace/1` object.

    Sub-agents are children (`child`): each has its own token (or a key the proxy recognised it by) and records
    into this session's calls, tagged with its name, so the whole agent tree becomes one trace."""

    agent: str | None = None  # the sub-agent's name; None for the root agent
    trainable = True

    def __init__(self, token: str, meta: dict[str, Any] | None = None, max_children: int = 64) -> None:
        self.token = token
        self.root: Session = self
        self.children: dict[str, ChildSession] = {}  # by token (registered) or recognition key (black-box)
        self.max_children = max_children  # the most sub-agents this session's tree may open (proxy.max_children)
        self.children_refused = 0  # sub-agents refused over that cap
        self.planning = asyncio.Lock()  # one prompt of the tree is tokenized at a time (Proxy.begin)
        self.queued = 0  # requests of the tree holding `planning` or waiting for it (Proxy._planning)
        self.agents: list[dict[str, Any]] = []  # the tree of agents: {name, parent, trainable}, in opening order
        self.harness_session: str | None = None  # the first harness session id seen (opencode's x-session-id)
        self.last_reply = ""  # the root agent's last answer, for a verifier (never written to the trace)
        self.meta = dict(meta or {})
        self.started_at = time.time()
        self.last_active = self.started_at
        self.calls: list[CallRecord] = []
        self.tools: list[dict[str, Any]] = []
        self.pinned_version: int | None = None  # `pin` policy: the version this session's calls are served by
        self.held_version = False  # opened with a version: kept under any policy, never left for the live one
        self._pending_tools: dict[str, tuple[str, float]] = {}  # tool_call_id -> (name, issued at)
        self.telemetry = ReceivedTools()  # what the agent CLI exported about its tools (otel_in.py)
        self.rejected: list[dict[str, Any]] = []  # the last 100 requests answered with a 4xx: the trace keeps them
        self.rejected_count = 0  # all of them
        self._rendered: _Rendered | None = None  # the last planned request: (messages, tools key, rendered text)
        self.replica_switches: list[dict[str, Any]] = []  # generations moved off a dead engine replica (replicas.py)
        self.replica_moves: list[dict[str, Any]] = []  # the session moved to a less-loaded replica (engines/routing.py)
        self.agent_key_digest: bytes | None = None  # of the tree's scoped credential (issue_agent_key), not the key
        # awaited as each call of a trained agent of the tree arrives, before it is generated (train.credit: turn)
        self.on_call: Callable[[CallRecord], Awaitable[None]] | None = None

    def issue_agent_key(self) -> str:
        """A white-box agent's credential for this session's tree: it opens and retires the tree's sub-agents
        (`POST /s/<token>/children`, `/retire`) and nothing else; the control token never leaves hrl. Only its
        digest is kept, so the proxy's session table holds no key to find; a new one replaces the last."""
        if self.root is not self:
            raise ValueError("a sub-agent shares its root's agent key")
        key = secrets.token_urlsafe(24)
        self.agent_key_digest = hashlib.blake2b(key.encode(), digest_size=32).digest()
        return key

    def admits(self, key: str) -> bool:
        """Whether `key` is this tree's agent key (constant-time; a tree without one admits nothing)."""
        mine = self.root.agent_key_digest
        given = hashlib.blake2b(key.encode(errors="replace"), digest_size=32).digest()
        return mine is not None and hmac.compare_digest(given, mine)

    def child(self, key: str, name: str, trainable: bool = True, parent: Session | None = None) -> ChildSession:
        """The sub-agent `key` (a token, or a recognition key), opened on first use; its calls join this trace.
        `parent`: the agent that started it (default: the root agent). Names repeat as `name#2`, `name#3`…"""
        if key in self.children:
            return self.children[key]
        if len(self.children) >= self.max_children:
            self.children_refused += 1
            raise ChildLimitError(
                f"session {self.token} already has {len(self.children)} sub-agents, the most it may open",
                hint="raise proxy.max_children if the agent really starts that many",
            )
        taken = {a["name"] for a in self.agents}
        unique = (
            name if name not in taken else next(f"{name}#{i}" for i in itertools.count(2) if f"{name}#{i}" not in taken)
        )
        by = parent if parent is not None and parent is not self else None
        self.agents.append({"name": unique, "parent": by.agent if by is not None else None, "trainable": trainable})
        child = self.children[key] = ChildSession(self, key, unique, trainable and (by is None or by.trainable))
        return child

    def reject(self, dialect: str, status: int, message: str) -> None:
        """Record a request that was refused (malformed, over a limit); the last 100 are kept, all are counted."""
        self.last_active = now = time.time()
        entry = {"at": round(now - self.started_at, 3), "dialect": dialect, "status": status, "error": message[:500]}
        self.rejected = [*self.rejected[-99:], entry]
        self.rejected_count += 1

    # ---- prompt building -----------------------------------------------------------------------------------
    def plan(self, req: ChatRequest, template: ChatTemplate) -> PromptPlan:
        """The prompt ids of a request (an earlier call's ids reused where the history extends it). Runs off the
        event loop (`Proxy.begin`): it reads a copy of the calls, which only the loop changes."""
        keys = [message_key(m) for m in req.messages]
        tools_key = _digest(req.tools or [])
        shown_by = template.injected_tool_prompt(req.tools)  # the proxy's tool prompt, where the template has none
        text = template.render(req.messages, req.tools)
        rendered, self._rendered = self._rendered, (req.messages, tools_key, text)
        for parent in reversed(list(self.calls)):
            n = len(parent.message_keys)
            if (
                parent.agent == self.agent
                and parent.error is None
                and parent.tools_key == tools_key
                and len(keys) > n + 1
                and keys[:n] == parent.message_keys
                and keys[n] == parent.reply_key
            ):
                suffix = self._suffix(req, template, parent, text, rendered)
                if suffix is not None:
                    ids = parent.sent_full_ids + template.encode(suffix)
                    return PromptPlan(ids, parent, keys, tools_key, IMAGE_MARK.findall(text), shown_by)
        return PromptPlan(template.encode(text), None, keys, tools_key, IMAGE_MARK.findall(text), shown_by)

    def forget_rendering(self) -> None:
        """Let go of the last planned request's messages and text, kept to render the next request once less: after a
        refused prompt (up to `proxy.max_prompt_bytes` of it), which no later call extends."""
        self._rendered = None

    @staticmethod
    def _suffix(
        req: ChatRequest, template: ChatTemplate, parent: CallRecord, text: str, rendered: _Rendered | None
    ) -> str | None:
        """The text after the parent's sampled tokens: the end of the assistant turn, then the new messages.
        `rendered`: the previous request's messages and their rendering, reused when they are these messages."""
        n = len(parent.message_keys)
        if rendered is not None and rendered[1] == parent.tools_key and rendered[0] == req.messages[:n]:
            before = rendered[2]  # the same messages and tools render the same text: one render saved per call
        else:
            before = template.render(req.messages[:n], req.tools)
        upto = template.render(req.messages[: n + 1], req.tools, add_generation_prompt=False)
        if not (upto.startswith(before) and text.startswith(upto)):
            return None  # the template is not append-only for this conversation
        turn, after = upto[len(before) :], text[len(upto) :]
        sampled_stop = parent.response_ids[-1:] and parent.response_ids[-1] in template.stop_ids
        if sampled_stop:  # the token the model stopped at, wherever the template writes it
            stop = template.decode(parent.response_ids[-1:])
            cut = turn.rfind(stop)
            if cut >= 0:
                return turn[cut + len(stop) :] + after
            if stop and after.startswith(stop):  # the turn ends by opening the next message (GLM's <|observation|>)
                return after[len(stop) :]
        end = template.end_of_turn
        cut = turn.rfind(end)
        if cut < 0:
            return None
        return (turn[cut + len(end) :] if sampled_stop else turn[cut:]) + after

    # ---- recording -----------------------------------------------------------------------------------------
    def open_call(self, dialect: str, req: ChatRequest, plan: PromptPlan, body_hash: str) -> Call:
        """Open a call for a request whose prompt is planned; it joins the trace when it ends (see `Call`)."""
        now = time.time()
        self.last_active = now
        for m in req.messages:  # tool results that came back since the model asked for them
            tcid = m.get("tool_call_id")
            if m["role"] == "tool" and tcid in self._pending_tools:
                name, issued = self._pending_tools.pop(tcid)
                self.tools.append({"name": name, "tool_call_id": tcid, "started_at": issued, "ended_at": now})
        system = req.messages[0]["content"] if req.messages and req.messages[0]["role"] == "system" else ""
        record = CallRecord(
            call_id=f"c{len(self.calls) + 1}-{uuid.uuid4().hex[:6]}",
            dialect=dialect,
            stream=req.stream,
            started_at=now,
            prompt_ids=plan.prompt_ids,
            parent_id=plan.parent.call_id if plan.parent else None,
            message_keys=plan.message_keys,
            tools_key=plan.tools_key,
            has_tools=bool(req.tools),
            system_text=system[:2000],
            body_hash=body_hash,
            agent=self.agent,
            trainable=self.trainable,
            dropped_media=media_counts(req.media) or None,  # what proxy.media let through without its media
            media=_media_records(req, plan) or None,
            tool_prompt=plan.tool_prompt,
        )
        return Call(self, record, plan, req)

    def commit(self, call: CallRecord, reply: ParsedReply | None) -> None:
        """Take an ended call into the trace (`Call` does this once, when it finishes, fails or aborts)."""
        call.ended_at = self.last_active = time.time()
        if reply is not None:
            call.reply_key = reply_key(reply)
            call.tool_calls = reply.tool_calls
            for tc in reply.tool_calls:
                self._pending_tools[tc["id"]] = (tc["function"]["name"], call.ended_at)
        # a retry (the same agent resending the identical request right after) replaces that agent's last record;
        # another agent's identical request is a call of its own (voters and best-of-n sub-agents send exactly that)
        mine = next((i for i in range(len(self.calls) - 1, -1, -1) if self.calls[i].agent == call.agent), None)
        if mine is not None and self.calls[mine].body_hash == call.body_hash:
            del self.calls[mine]
        self.calls.append(call)

    # ---- the trace -----------------------------------------------------------------------------------------
    def last_turn(self) -> CallRecord | None:
        """The last agent turn: side calls (a title made after the turn that failed) do not count, unless the
        session made nothing else. How the episode ended is read from it."""
        agentic = {c.agent for c in self.calls if c.has_tools}
        turns = [c for c in self.calls if not _is_side(c, agentic)]
        return (turns or self.calls or [None])[-1]

    def to_trace(
        self,
        *,
        status: str = "ok",
        failure_reason: str | None = None,
        reward: float | None = None,
        reward_info: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        success: Any = UNSAID,
    ) -> dict[str, Any]:
        """The session as an `hrl.trace/1` record. `success`: the task's own pass/fail (apart from a shaped
        reward), None for unknown; not given, it is `binary_success(reward, reward_info)`."""
        ended = time.time()
        agentic = {c.agent for c in self.calls if c.has_tools}  # the agents that use tools (per sub-agent)
        last = self.last_turn()
        if failure_reason is None and last is not None and last.error is not None:
            failure_reason = "context_overflow" if "context" in last.error else "engine_error"
        if failure_reason is not None:
            status = "failed"
        t0 = self.started_at
        meta = self.meta
        extras = ({"rejected": self.rejected} if self.rejected else {}) | self._agent_tree()
        if failure_reason not in INFRA_FAILURES and is_degenerate(self.calls, agentic):
            extras["degenerate"] = True
        if self.replica_switches:
            extras["replica_switches"] = self.replica_switches
        if self.replica_moves:
            extras["replica_moves"] = self.replica_moves
        if dropped := _dropped_media(self.calls):
            extras["dropped_media"] = dropped
        env = meta.get("env") or {}
        replica = next((c.replica for c in reversed(self.calls) if c.replica), None)
        if replica is not None:  # behind a ReplicaSet: the replica that served the session last
            env = {**env, "replica": replica}
        return {
            "schema": SCHEMA,
            "trace_id": meta.get("trace_id") or uuid.uuid4().hex,
            "session": self.token,
            "task_id": meta.get("task_id"),
            "group_id": meta.get("group_id"),
            "agent": meta.get("agent") or {},
            "env": env,
            "model": meta.get("model") or {},
            "status": status,
            "failure_reason": failure_reason,
            "reward": reward,
            "reward_info": reward_info or {},
            "success": binary_success(reward, reward_info) if success is UNSAID else success,
            "started_at": round(t0, 3),
            "ended_at": round(ended, 3),
            "calls": _encode_calls(self.calls, t0, agentic),
            "tools": [
                {**t, "started_at": round(t["started_at"] - t0, 3), "ended_at": round(t["ended_at"] - t0, 3)}
                for t in merge_tools(self.tools, self.telemetry)
            ],
            "metadata": {**meta.get("metadata", {}), **(extra or {})}
            | ({"rejected_requests": self.rejected_count} if self.rejected_count else {})
            | ({"telemetry_events": dict(self.telemetry.counts)} if self.telemetry.counts else {})
            | ({"children_refused": self.children_refused} if self.children_refused else {}),
        } | extras

    def _agent_tree(self) -> dict[str, Any]:
        """`agents`: the root agent and its sub-agents with their parents and call counts (only when it has any)."""
        if not self.agents:
            return {}
        count = {a["name"]: 0 for a in self.agents} | {"": 0}
        for c in self.calls:
            count[c.agent or ""] += 1
        root = {"name": (self.meta.get("agent") or {}).get("name") or "main", "parent": None, "trainable": True}
        tree = [{**root, "calls": count[""]}]
        tree += [{**a, "parent": a["parent"] or root["name"], "calls": count[a["name"]]} for a in self.agents]
        return {"agents": tree}


class ChildSession(Session):
    """A sub-agent of a session: its own token and conversations, recorded into its root's calls and trace."""

    def __init__(self, root: Session, token: str, name: str, trainable: bool) -> None:
        self._root = root  # before Session.__init__: its `last_active` goes to the root
        super().__init__(token, root.meta)
        self.root, self.agent, self.trainable = root, name, trainable
        self.calls, self.tools, self._pending_tools = root.calls, root.tools, root._pending_tools  # one trace
        self.telemetry = root.telemetry

    @property  # type: ignore[override]
    def last_active(self) -> float:
        return self._root.last_active

    @last_active.setter
    def last_active(self, value: float) -> None:
        self._root.last_active = value

    @property  # type: ignore[override]
    def pinned_version(self) -> int | None:  # `pin`: the whole agent tree keeps one version
        return self._root.pinned_version

    @pinned_version.setter
    def pinned_version(self, value: int | None) -> None:
        if value is not None or not hasattr(self._root, "pinned_version"):
            self._root.pinned_version = value

    @property  # type: ignore[override]
    def held_version(self) -> bool:  # opened with a version: the whole agent tree keeps it
        return self._root.held_version

    @held_version.setter
    def held_version(self, value: bool) -> None:
        if value or not hasattr(self._root, "held_version"):
            self._root.held_version = value

    def reject(self, dialect: str, status: int, message: str) -> None:
        self.root.reject(dialect, status, f"[{self.agent}] {message}")

    def child(self, key: str, name: str, trainable: bool = True, parent: Session | None = None) -> ChildSession:
        return self.root.child(key, name, trainable, parent or self)


def _is_side(call: CallRecord, agentic: set[str | None]) -> bool:
    """A call without tools from an agent that uses tools (a title, a summary), or one of the known side prompts."""
    low = call.system_text.lower()
    return (call.agent in agentic and not call.has_tools) or any(s in low for s in _SIDE_MARKERS)


def is_degenerate(calls: list[CallRecord], agentic: set[str | None]) -> bool:
    """One model call (side calls aside) for an agentic task (it offered tools): the agent never saw a tool result,
    so the trace says little about working with tools (an agent that gave up, or a harness that breaks after one
    turn)."""
    main = [c for c in calls if not _is_side(c, agentic)]
    return len(main) == 1 and main[0].has_tools


def _media_records(req: ChatRequest, plan: PromptPlan) -> list[dict[str, Any]]:
    """A call's `media`: each image of its prompt, in placeholder order (the placeholder range comes from the
    engine, `Call._expanded`)."""
    by_sha = {m.sha256: m for m in req.media if m.data is not None}
    return [{"sha256": sha, "mime": by_sha[sha].mime, "bytes": len(by_sha[sha].data or b""),
             "width": by_sha[sha].width, "height": by_sha[sha].height} for sha in plan.images]  # fmt: skip


def _dropped_media(calls: list[CallRecord]) -> dict[str, int]:
    """The trace's flag: media parts dropped over all its calls' requests, by kind (a part that a conversation
    sends again in each later request counts in each)."""
    total: dict[str, int] = {}
    for c in calls:
        for kind, n in (c.dropped_media or {}).items():
            total[kind] = total.get(kind, 0) + n
    return total


def _encode_calls(calls: list[CallRecord], t0: float, agentic: set[str | None]) -> list[dict[str, Any]]:
    out = []
    for i, c in enumerate(calls):
        d: dict[str, Any] = {
            "call_id": c.call_id,
            "dialect": c.dialect,
            "stream": c.stream,
            "side": _is_side(c, agentic),
            "started_at": round(c.started_at - t0, 3),
            "first_token_at": round((c.first_token_at or c.started_at) - t0, 3),
            "ended_at": round((c.ended_at or c.started_at) - t0, 3),
        }
        ref, length = _best_ref(calls[:i], c)
        if ref is not None:
            d["prompt_ref"] = {"call_id": ref.call_id, "length": length}
            d["prompt_suffix_ids"] = c.prompt_ids[length:]
        else:
            d["prompt_ids"] = c.prompt_ids
        d["response_ids"] = c.response_ids
        d["response_logprobs"] = [round(x, 5) for x in c.response_logprobs]
        d["versions"] = [list(v) for v in c.versions]
        d["finish_reason"] = c.finish_reason
        if c.parent_id:
            d["parent"] = c.parent_id
        if c.agent is not None:
            d["agent"] = c.agent
        if not c.trainable:
            d["trainable"] = False
        if c.replica is not None:
            d["replica"] = c.replica
        if c.error:
            d["error"] = c.error
        if c.tool_parse_error:
            d["tool_parse_error"] = c.tool_parse_error
        if c.sampling:
            d["sampling"] = c.sampling
        if c.dropped_media:
            d["dropped_media"] = c.dropped_media
        if c.media:
            d["media"] = c.media
        if c.media and c.image_processor:
            d["image_processor"] = c.image_processor
        if c.tool_prompt:
            d["tool_prompt"] = c.tool_prompt
        if c.turn_scored:
            d["turn_score"] = c.turn_score
        out.append(d)
    return out


def _best_ref(earlier: list[CallRecord], call: CallRecord) -> tuple[CallRecord | None, int]:
    """The earlier call sharing the longest token prefix with this prompt (the parent when there is one)."""
    by_id = {c.call_id: c for c in earlier}
    if call.parent_id in by_id:
        parent = by_id[call.parent_id]
        return parent, len(parent.full_ids)
    best, best_len = None, 0
    for c in earlier:
        full, n = c.full_ids, 0
        limit = min(len(full), len(call.prompt_ids))
        while n < limit and full[n] == call.prompt_ids[n]:
            n += 1
        if n > best_len:
            best, best_len = c, n
    return (best, best_len) if best_len >= 16 else (None, 0)
