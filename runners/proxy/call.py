"""One LLM call from open to end: `Call` owns its record's whole life (open, add tokens, finish, fail, abort).

A session opens it (`Session.open_call`), the proxy feeds it the engine's token deltas while it streams, and it
ends exactly once: `finish` (the reply is parsed and the call joins the session's trace), `fail` (an engine or
context error, recorded with `finish_reason: error`) or `abort` (the agent went away mid-response).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from hrl.runners.engines.base import ExpandedPrompt, ImageInput, TokenDelta
from hrl.runners.errors import EngineError
from hrl.runners.proxy.dialects.base import ChatRequest, ChatResult
from hrl.runners.proxy.template import ChatTemplate, ParsedReply, parse_reply
from hrl.runners.trace import add_version

__all__ = ["Call", "CallOwner", "CallRecord", "PromptPlan"]


@dataclass
class PromptPlan:
    """How a request's prompt was built: `parent` is the call whose prompt + response it extends, if any."""

    prompt_ids: list[int]
    parent: CallRecord | None
    message_keys: list[str]
    tools_key: str
    images: list[str] = field(default_factory=list)  # sha256 of each image placeholder in prompt_ids, in order
    tool_prompt: str | None = None  # the tool prompt the proxy showed the tools in (the template cannot): hermes


@dataclass
class CallRecord:
    """What the trace keeps of a call (encoded by the session into an `hrl.trace/1` call)."""

    call_id: str
    dialect: str
    stream: bool
    started_at: float
    prompt_ids: list[int]
    parent_id: str | None
    message_keys: list[str]
    tools_key: str
    has_tools: bool
    system_text: str
    body_hash: str
    first_token_at: float | None = None
    ended_at: float | None = None
    response_ids: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    versions: list[tuple[int, int]] = field(default_factory=list)
    finish_reason: str = "stop"
    reply_key: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    sampling: dict[str, Any] | None = None  # {"asked": the agent's sampling knobs, "used": what was sampled with}
    tool_parse_error: str | None = None  # a tool-call block the parser could not read (it reached the agent as text)
    agent: str | None = None  # the sub-agent that made the call (None: the session's own agent)
    trainable: bool = True  # False: recorded, never trained on (an untrained critic, a judge)
    replica: str | None = None  # the engine replica that generated it (behind a ReplicaSet; the last, after a failover)
    dropped_media: dict[str, int] | None = None  # media parts left out of the prompt by kind (proxy.media: drop)
    # a call with images: {sha256, mime, bytes, width, height, placeholder: [offset, length] in prompt_ids} each, in
    # prompt order; prompt_ids are then the engine's (placeholders expanded), sent_ids the ids the proxy sent
    media: list[dict[str, Any]] | None = None
    sent_ids: list[int] | None = None
    image_processor: dict[str, Any] | None = None  # the settings the engine's image processor made the pixels with
    tool_prompt: str | None = None  # the tool prompt the proxy showed the tools in (proxy.tool_prompt): hermes
    # train.credit: turn: the verifier's score of the sandbox as the call arrived (None: scoring failed or timed out)
    turn_scored: bool = False
    turn_score: float | None = None

    @property
    def full_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def sent_full_ids(self) -> list[int]:
        """The ids a later prompt extends: as sent (one placeholder per image, which the engine expands again)."""
        return (self.prompt_ids if self.sent_ids is None else self.sent_ids) + self.response_ids


class CallOwner(Protocol):
    """The session a call belongs to, as the call sees it (`session.Session` is one, and opens its calls): whether
    its agent is trained, its root (the episode: token, start, the last answer, the replica failovers and moves),
    and `commit`, which takes the ended call into the trace."""

    trainable: bool
    token: str
    started_at: float
    last_reply: str
    replica_switches: list[dict[str, Any]]
    replica_moves: list[dict[str, Any]]

    @property
    def root(self) -> CallOwner: ...

    def commit(self, call: CallRecord, reply: ParsedReply | None) -> None: ...


class Call:
    def __init__(self, session: CallOwner, record: CallRecord, plan: PromptPlan, req: ChatRequest) -> None:
        self.session, self.record, self.plan, self.req = session, record, plan, req
        self.ended = False
        self.images: list[ImageInput] = []  # sent with the prompt (Proxy.begin), in placeholder order

    @property
    def call_id(self) -> str:
        return self.record.call_id

    # --- engines.base.Routed: what a replica set notes of the call it places ---
    @property
    def sticky_key(self) -> str:
        return self.session.root.token

    def ran_on(self, replica: str) -> None:
        self.record.replica = replica

    def switched(self, source: str, target: str, after_tokens: int, error: str) -> None:
        """A failover mid-generation, kept in the trace (`replica_switches`)."""
        root = self.session.root
        root.replica_switches.append({"call_id": self.call_id, "from": source, "to": target,
                                      "after_tokens": after_tokens, "at": round(time.time() - root.started_at, 3),
                                      "error": error[:300]})  # fmt: skip

    def moved(self, source: str, target: str, loads: dict[str, int]) -> None:
        """The session moved to a less-loaded replica (cache_aware routing), kept in the trace (`replica_moves`)."""
        root = self.session.root
        root.replica_moves.append({"call_id": self.call_id, "from": source, "to": target, "loads": loads,
                                   "at": round(time.time() - root.started_at, 3)})  # fmt: skip

    def add(self, delta: TokenDelta) -> None:
        """Append an engine delta: its ids, logprobs, the version that sampled them, and a finish reason."""
        rec = self.record
        if delta.prompt is not None:
            self._expanded(delta.prompt)
        if rec.first_token_at is None:
            rec.first_token_at = time.time()
        add_version(rec.versions, len(rec.response_ids), delta.version, len(delta.token_ids))
        rec.response_ids.extend(delta.token_ids)
        rec.response_logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            rec.finish_reason = delta.finish_reason

    def _expanded(self, prompt: ExpandedPrompt) -> None:
        """The engine's prompt for a call with images: recorded as the call's prompt ids, with each image's
        placeholder range. One that does not extend its parent's ids (an image expanded otherwise than before)
        starts a new branch rather than claim a prefix it does not share."""
        rec, media = self.record, self.record.media or []
        if rec.sent_ids is not None:  # resumed after a publish: the same prompt, with the tokens sampled so far
            if list(prompt.prompt_ids) != rec.prompt_ids + rec.response_ids:
                raise EngineError("resumed after a publish, the engine expanded the images otherwise than before")
            return
        if len(prompt.placeholders) != len(media):
            raise EngineError(
                f"the {len(media)} images sent came back as {len(prompt.placeholders)} placeholder ranges"
            )
        if rec.sent_ids is None:
            rec.sent_ids = rec.prompt_ids
        rec.prompt_ids = list(prompt.prompt_ids)
        grids = prompt.grids or [None] * len(media)  # per image where the engine made grids (mRoPE)
        for m, (offset, length), grid in zip(media, prompt.placeholders, grids, strict=True):
            m["placeholder"] = [offset, length]
            if grid is not None:
                m["grid"] = list(grid)
        rec.image_processor = prompt.processor
        parent = self.plan.parent
        if parent is not None and rec.prompt_ids[: len(parent.full_ids)] != parent.full_ids:
            rec.parent_id = None

    def finish(self, template: ChatTemplate) -> ChatResult:
        """Parse what the model said, end the call, and return the result the dialect answers with."""
        rec = self.record
        text = template.reply_text(rec.response_ids)
        reply = parse_reply(template, text, tool_calls=bool(self.req.tools), tools=self.req.tools)
        rec.tool_parse_error = reply.parse_error
        finish = "tool_calls" if reply.tool_calls else ("length" if rec.finish_reason == "length" else "stop")
        if reply.tool_calls:
            rec.finish_reason = "tool_calls"
        if self.session.trainable:  # the answer a verifier reads: the last one of an agent being trained
            self.session.root.last_reply = reply.content
        self._end(reply)
        return ChatResult(reply, finish, len(rec.prompt_ids), len(rec.response_ids))

    def fail(self, message: str) -> None:
        """End the call as failed (engine error, context overflow): recorded, never trained on."""
        self.record.error = message
        self.record.finish_reason = "error"
        self._end(None)

    def abort(self) -> None:
        """End the call cut short (the agent disconnected, the episode was cancelled)."""
        self.record.finish_reason = "abort"
        self._end(None)

    def _end(self, reply: ParsedReply | None) -> None:
        if self.ended:
            return
        self.ended = True
        self.session.commit(self.record, reply)
