"""The recording proxy: sessions in front of one engine (or a `ReplicaSet` of several), recording every call
token-exactly.

`Proxy` is the in-process API (the rollout manager uses it directly); `runners.proxy.server` puts HTTP in front
of it. Sessions end on `end_session` (or `POST /s/<token>/end`), after an idle timeout, or at `close()`; each
ending writes exactly one trace line.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from hrl.config import BYTES_PER_TOKEN, ProxyConfig
from hrl.runners.durable import write_atomically
from hrl.runners.engines.base import NO_OP_SAMPLING, Engine, ImageInput, SamplingParams
from hrl.runners.errors import ContextLengthError, EngineError
from hrl.runners.proxy.call import Call, PromptPlan
from hrl.runners.proxy.dialects.base import (
    BadRequestError,
    ChatRequest,
    ChatResult,
    MediaPart,
    MediaRefusedError,
    admit_media,
    text_bytes,
)
from hrl.runners.proxy.reasoning import get_reasoning_parser
from hrl.runners.proxy.session import ChildLimitError, Session, SessionBusyError
from hrl.runners.proxy.subagents import recognise_subagent
from hrl.runners.proxy.template import IMAGE_MARK, ChatTemplate, IncrementalDecoder
from hrl.runners.proxy.tokens import owned_token, owner
from hrl.runners.proxy.toolparsers import get_tool_parser
from hrl.runners.redact import default_redactor
from hrl.runners.trace import INFRA_FAILURES, TraceWriter, without_calls

__all__ = [
    "BYTES_PER_TOKEN",
    "MediaTooLargeError",
    "Proxy",
    "ProxyConfig",
    "SessionEndedError",
    "UnknownSessionError",
]


_INLINE_BYTES = 1 << 16  # bodies up to this size are read and hashed on the loop (tens of microseconds)


def _hash(raw: bytes) -> str:
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


class UnknownSessionError(KeyError):
    """A request named a session token the proxy does not know (and may not create)."""


class MediaTooLargeError(MediaRefusedError):
    """An image over `proxy.max_image_bytes`: a 413 in the dialect's shape naming the part."""


class SessionEndedError(RuntimeError):
    """The session ended (its owner, the idle reaper) while a request's prompt was being built."""


class Proxy:
    def __init__(
        self, engine: Engine, template: ChatTemplate, config: ProxyConfig, traces: TraceWriter | None = None
    ) -> None:
        self.engine, self.template, self.config, self.traces = engine, template, config, traces
        # where images' bytes are kept: media/ beside the trace file, or where a run keeps its traces (`keep_media`)
        self.media_dir: Path | None = traces.path.parent / "media" if traces is not None else None
        if config.tool_parser != "auto":  # else the template's own choice (detected from the model)
            template.tool_parser = get_tool_parser(config.tool_parser)
        if config.reasoning_parser != "auto":
            template.reasoning_parser = get_reasoning_parser(config.reasoning_parser)
        template.tool_prompt = config.tool_prompt  # for a template that cannot show tools (ChatTemplate.render)
        self.sessions: dict[str, Session] = {}
        self.finished: list[dict[str, Any]] = []  # traces written, kept for the in-process API (bounded)
        self._reaper: asyncio.Task[None] | None = None
        self._open = asyncio.Event()  # cleared while a publish (or a pause) is under way: new generations wait
        self._open.set()
        self._held = False  # paused through `pause()`: a publish ending does not reopen
        self._inflight: dict[str, Call] = {}
        self._preempted: set[str] = set()
        self._waiting = 0
        # pause_s: total time publishes held requests; queue_depth: most requests waiting at once (reset by readers)
        # children_refused: sub-agents refused over proxy.max_children (all sessions, since the start)
        self.stats: dict[str, float] = {"proxy/pause_s": 0.0, "proxy/publishes": 0.0, "proxy/queue_depth": 0.0,
                                        "proxy/children_refused": 0.0, "proxy/queued_refused": 0.0}  # fmt: skip
        self.tokenizing = 0  # prompts being rendered and tokenized right now, off the loop
        self._pool: ThreadPoolExecutor | None = None
        self.tokens = 0  # sampled tokens the proxy has streamed (all calls, both streaming modes)
        self._cpu_mark: tuple[float, int] | None = None

    @property
    def max_context(self) -> int:
        """The context window: the configured one, else the engine's (known once it started), else 32768."""
        return self.config.max_context or int(self.engine.max_model_len or 0) or 32768

    @property
    def takes_images(self) -> bool:
        """Whether the served model has vision: then dialects keep image parts (decoded) instead of refusing or
        dropping them, and `begin` sends them to the engine, or refuses them when the engine cannot take images."""
        return self.template.takes_images

    @property
    def max_prompt_bytes(self) -> int:
        """The most prompt text a request may carry: the context window × 32 bytes, or the configured absolute cap
        where that is lower (0: none)."""
        by_context = self.max_context * BYTES_PER_TOKEN
        return min(self.config.max_prompt_bytes, by_context) if self.config.max_prompt_bytes else by_context

    # ---- sessions ------------------------------------------------------------------------------------------
    def open_session(
        self, token: str | None = None, meta: dict[str, Any] | None = None, version: int | None = None
    ) -> Session:
        """Register a session (default token: 128 random bits); its owner ends it with `end_session`. `version`:
        every call of the session and its sub-agents is served by that policy version, whatever the version policy
        (a held-out evaluation of one policy while training publishes newer ones); None = the version policy's."""
        token = self._token(token)
        if token in self.sessions:
            raise ValueError(f"session {token} already exists")
        session = self.sessions[token] = Session(token, meta, self.config.max_children)
        session.pinned_version = version
        session.held_version = version is not None
        return session

    def open_child(self, parent: str, name: str, trainable: bool = True, token: str | None = None) -> Session:
        """Register a sub-agent of session `parent` under its own token: its calls are recorded into the parent's
        trace as the agent `name` (`trainable=False`: recorded, never trained on). It ends with its root."""
        token = self._token(token)
        if token in self.sessions:
            raise ValueError(f"session {token} already exists")
        if parent not in self.sessions:
            raise UnknownSessionError(parent)
        child = self.sessions[token] = self._counted(lambda: self.sessions[parent].child(token, name, trainable))
        return child

    def recognise(self, session: Session, headers: Mapping[str, str], req: ChatRequest) -> Session:
        """The session a request records into: `session`, or the child for a CLI's own sub-agent that sent it
        (`runners.proxy.subagents`). Raises ChildLimitError (counted) past `max_children`."""
        return self._counted(lambda: recognise_subagent(session, headers, req))

    def _counted(self, open_child: Any) -> Session:
        try:
            return open_child()  # type: ignore[no-any-return]
        except ChildLimitError:
            self.stats["proxy/children_refused"] += 1
            raise

    def _token(self, token: str | None) -> str:
        """A new session's token: the one given, if this worker owns it, else a fresh 128-bit one it owns."""
        workers, me = self.config.workers, self.config.worker_index
        token = token or (owned_token(me, workers) if workers > 1 else secrets.token_urlsafe(16))
        if owner(token, workers) != me:
            raise ValueError(f"session {token} belongs to proxy worker {owner(token, workers)} of {workers}, not {me}")
        return token

    def session_for(self, token: str) -> Session:
        if token in self.sessions:
            return self.sessions[token]
        if not self.config.open_sessions or owner(token, self.config.workers) != self.config.worker_index:
            raise UnknownSessionError(token)
        return self.open_session(token, {"metadata": {"opened_by": "first request"}})

    def end_session(self, token: str, **outcome: Any) -> dict[str, Any]:
        """End a session and write its trace. `outcome`: status, failure_reason, reward, reward_info, extra."""
        session = self.sessions.pop(token, None)
        if session is None:
            raise UnknownSessionError(token)
        if session.root is not session:  # a sub-agent ends: its token stops working, its calls stay in the trace
            return {"agent": session.agent, "calls": sum(c.agent == session.agent for c in session.calls)}
        for child in session.children:  # the tree ends with its root: no token of it is served any more
            self.sessions.pop(child, None)
        generating = any(c.session.root is session for c in self._inflight.values())  # a call cut off at the end
        if not session.calls and not generating and outcome.get("failure_reason") not in INFRA_FAILURES:
            outcome = without_calls(outcome)
        trace = session.to_trace(**outcome)
        if self.traces is not None:
            self.traces.write(trace)
        self.finished = [*self.finished[-255:], trace]
        return trace

    def take_cpu_per_token(self) -> float | None:
        """`proxy/cpu_us_per_token` since the previous call: CPU microseconds of the calling thread (call it on the
        event loop the proxy serves on: the proxy, and whatever else runs on that loop) ÷ tokens streamed in that
        window. None on the first call (it sets the mark) and when no token was streamed."""
        now, mark = (time.thread_time(), self.tokens), self._cpu_mark
        self._cpu_mark = now
        if mark is None or now[1] == mark[1]:
            return None
        return (now[0] - mark[0]) / (now[1] - mark[1]) * 1e6

    def pause(self) -> None:
        """Hold new generations in the proxy (agents just wait) until `resume`."""
        self._held = True
        self._open.clear()

    def resume(self) -> None:
        self._held = False
        self._open.set()

    def in_flight(self) -> list[Call]:
        """The calls generating right now."""
        return list(self._inflight.values())

    def ended(self, token: str) -> dict[str, Any] | None:
        """The trace a session ended with, while it is among the last ones kept (None if not found)."""
        return next((t for t in reversed(self.finished) if t["session"] == token), None)

    def close(self) -> list[dict[str, Any]]:
        """End every open session (server stopping): nothing is lost."""
        if self._reaper is not None:
            self._reaper.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        roots = [t for t, s in self.sessions.items() if s.root is s]
        return [self.end_session(t, **self._cut_short(t), extra={"ended_by": "proxy stop"}) for t in roots]

    def _cut_short(self, token: str) -> dict[str, Any]:
        """A session with a call still generating at the stop, or whose last call the stop cut off (its sub-agents'
        calls are its own), did not end: `cancelled`, not trained on, and run again on resume. One between calls keeps what its
        calls say."""
        session, calls = self.sessions[token], self.sessions[token].calls
        generating = any(c.session.root is session for c in self._inflight.values())
        return {"failure_reason": "cancelled"} if generating or (calls and calls[-1].finish_reason == "abort") else {}

    def start_reaper(self) -> None:
        if self.config.idle_timeout_s > 0 and self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(min(self.config.idle_timeout_s / 4, 30))
            cutoff = time.time() - self.config.idle_timeout_s
            for token, s in list(self.sessions.items()):
                if s.root is s and s.last_active < cutoff:
                    self.end_session(token, extra={"ended_by": "idle timeout"})

    # ---- calls ---------------------------------------------------------------------------------------------
    async def begin(self, session: Session, dialect: str, req: ChatRequest, body_hash: str) -> Call:
        """Build the prompt (reusing sampled ids) and open the call. Raises ContextLengthError for a prompt that
        cannot fit: the call is recorded as failed, with why and without its prompt ids.

        The text is measured, redacted, rendered and tokenized in a worker thread (the tokenizer lets go of the
        GIL), so the loop serves everyone else meanwhile, under the session tree's lock, so one session's prompts
        take one thread at a time (`count_tokens` too). A prompt over `max_prompt_bytes` is refused before it is
        redacted or tokenized, and one holding media by `proxy.media: refuse` (a MediaRefusedError, before anything
        is recorded)."""
        admit_media(req.media, self.config.media)
        self.template.injected_tool_prompt(req.tools)  # tools the template cannot show, under refuse: a 400
        images = self._admit_images(req.media)
        async with self._planning(session):
            size, req, plan = await self._off_loop(self._plan, session, req)
        if self.sessions.get(session.root.token) is not session.root:
            raise SessionEndedError(f"session {session.root.token} ended while the request was being read")
        if plan is None:
            raise self._refuse(session, dialect, req, body_hash, self._over_cap(size))
        if len(plan.prompt_ids) + 1 > self.max_context:
            n = len(plan.prompt_ids)
            msg = f"prompt of {n} tokens exceeds the context window of {self.max_context} tokens"
            raise self._refuse(session, dialect, req, body_hash, msg)
        if images:
            placeholders = plan.prompt_ids.count(self.template.image_token_id)  # type: ignore[arg-type]
            if placeholders != len(plan.images):  # the text spells the image token itself: never guess which is which
                raise BadRequestError(
                    f"the prompt holds {placeholders} image placeholder tokens for {len(plan.images)} images (does "
                    f"the text contain {self.template.image_placeholder!r}?)"
                )
            await self._off_loop(self._store_media, images, prompt=False)
        call = session.open_call(dialect, req, plan, body_hash)
        if session.trainable and (on_call := session.root.on_call) is not None:
            await on_call(call.record)  # the sandbox is still as the agent's last tools left it
        call.images = [ImageInput(images[sha].data or b"", images[sha].mime, sha) for sha in plan.images]
        return call

    def _admit_images(self, media: list[MediaPart]) -> dict[str, MediaPart]:
        """The images a request holds for a vision model, by sha256, checked against the limits and the engine."""
        images = [m for m in media if m.data is not None]
        if not images:
            return {}
        if not self.engine.takes_images:
            raise MediaRefusedError(
                f"{images[0].at}: an image part; the {self.engine.name} engine cannot take images (the embedded "
                "engine and vLLM can)"
            )
        if why := self.engine.images_refused:
            raise MediaRefusedError(f"{images[0].at}: an image part; {why}")
        if len(images) > self.config.max_images:
            raise MediaRefusedError(f"{images[self.config.max_images].at}: {len(images)} images in one request, over "
                                    f"the limit of {self.config.max_images} (proxy.max_images)")  # fmt: skip
        for m in images:
            if len(m.data or b"") > self.config.max_image_bytes:
                raise MediaTooLargeError(f"{m.at}: an image of {len(m.data or b'')} bytes, over the limit of "
                                         f"{self.config.max_image_bytes} (proxy.max_image_bytes)")  # fmt: skip
        return {m.sha256: m for m in images}

    def keep_media(self, folder: str | Path) -> None:
        """Keep images' bytes in `folder` (`media/` beside a run's trace files, which the rollouts write, not the
        proxy): training reads them there (`hrl.train.media`)."""
        self.media_dir = Path(folder)

    def _store_media(self, images: dict[str, MediaPart]) -> None:
        """Each image's bytes, once per run: `media/<sha256>` beside the traces (written whole, then renamed)."""
        if self.media_dir is None:
            return
        folder = self.media_dir
        folder.mkdir(parents=True, exist_ok=True)
        for sha, m in images.items():
            if not (folder / sha).exists():
                write_atomically(folder / sha, m.data or b"")

    async def count_tokens(self, session: Session, req: ChatRequest) -> int:
        """The prompt tokens of a request as it stands (nothing recorded), checked and tokenized as `begin` does:
        off the loop, under the session tree's lock (200 parallel counts from one session had taken every tokenizer
        thread: another session's chats waited 24 s at the median). Raises ContextLengthError over the byte cap."""
        admit_media(req.media, self.config.media)
        self.template.injected_tool_prompt(req.tools)
        images = self._admit_images(req.media)
        template, engine = self.template, self.engine

        def count() -> int:
            size = self._check_size(req)
            if size > self.max_prompt_bytes:
                raise ContextLengthError(self._over_cap(size))
            text = template.render(req.messages, req.tools)
            ids = template.encode(text)
            if images and engine.expands_images:  # an engine that expands images in process: the run it would run
                sent = [ImageInput(images[sha].data or b"", images[sha].mime, sha) for sha in IMAGE_MARK.findall(text)]
                ids = engine.expand(ids, sent)[0].prompt_ids
            return len(ids)

        async with self._planning(session):
            return await self._off_loop(count)  # type: ignore[no-any-return]

    @staticmethod
    def _check_size(req: ChatRequest) -> int:
        return text_bytes(req.messages) + text_bytes(req.tools)

    def _over_cap(self, size: int) -> str:
        return (f"prompt of {size} bytes of text is over the limit of {self.max_prompt_bytes} (proxy.max_prompt_bytes, "
                f"and {BYTES_PER_TOKEN} bytes a token of the context window of {self.max_context} tokens)")  # fmt: skip

    def _plan(self, session: Session, req: ChatRequest) -> tuple[int, ChatRequest, PromptPlan | None]:
        """In a worker thread: the request's text size, then, under the cap, the redacted request and its plan."""
        size = self._check_size(req)
        if size > self.max_prompt_bytes:
            return size, req, None
        if self.config.redact:
            req = replace(req, messages=default_redactor().obj(req.messages))
        return size, req, session.plan(req, self.template)

    async def _off_loop(self, fn: Any, *args: Any, prompt: bool = True) -> Any:
        """Run `fn(*args)` in the tokenizer threads; `tokenizing` counts the prompts in them."""
        if self._pool is None:
            threads = self.config.tokenizer_threads or min(4, os.cpu_count() or 1)
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="hrl-tokenize")
        self.tokenizing += prompt
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        finally:
            self.tokenizing -= prompt

    async def read(
        self, session: Session, raw: bytes, parse: Callable[[bytes], ChatRequest]
    ) -> tuple[ChatRequest, str]:
        """The request a body holds (`parse(raw)`: JSON, the dialect's form, checked) and the body's hash (an
        identical retry is recorded once). A large body is read in a worker thread under the session tree's lock,
        as its prompt is tokenized: one session's flood of them is read one body at a time, beside the others'
        requests, not all at once on the loop (a 6.5 MB body of 100,000 short messages is 0.5 s of Python; a flood of
        1.3 MB ones took the others' median ×70 read on the loop, ×16 read here), and hashlib lets go of the GIL."""
        if len(raw) < _INLINE_BYTES:
            return parse(raw), _hash(raw)
        async with self._planning(session):
            return await self._off_loop(lambda: (parse(raw), _hash(raw)), prompt=False)  # type: ignore[no-any-return]

    @contextlib.asynccontextmanager
    async def _planning(self, session: Session) -> AsyncIterator[None]:
        """The session tree's prompt lock, refused (SessionBusyError, counted) where `max_queued_prompts` requests of
        the tree already hold or wait for it."""
        root = session.root
        if root.queued >= self.config.max_queued_prompts:
            self.stats["proxy/queued_refused"] += 1
            raise SessionBusyError(
                f"session {root.token} already has {root.queued} requests waiting to be read or tokenized "
                f"(proxy.max_queued_prompts {self.config.max_queued_prompts})",
                hint="send one session's requests one at a time, or raise proxy.max_queued_prompts",
            )
        root.queued += 1
        try:
            async with root.planning:
                yield
        finally:
            root.queued -= 1

    @staticmethod
    def _refuse(session: Session, dialect: str, req: ChatRequest, body_hash: str, why: str) -> ContextLengthError:
        """Record a prompt that cannot fit as a failed call holding why, not its ids nor its messages' keys (a
        refused call is no later call's parent), and let go of its rendering: what a refusal leaves, in the trace
        and in memory, is of bounded size whatever was sent. Returns the error to raise."""
        call = session.open_call(dialect, req, PromptPlan([], None, [], ""), body_hash)
        call.fail(why)
        session.forget_rendering()
        return ContextLengthError(why, hint="shorten the conversation (compact it) or serve a longer context")

    def params(self, req: ChatRequest) -> SamplingParams:
        """The engine's sampling parameters for a request: the agent's knobs the engine honours (all at their no-op
        values under `sampling: honest`), the others at their no-op values."""
        room = self.max_context - 1  # at least one token; the engine ends the call at the window
        return SamplingParams(
            max_tokens=max(1, min(int(req.max_tokens or self.config.default_max_tokens), room)),
            **self.knobs(req)[1],  # type: ignore[arg-type]
            seed=req.seed,
            stop_token_ids=self.template.stop_ids,
            ignore_eos=req.ignore_eos,
        )

    def knobs(self, req: ChatRequest) -> tuple[dict[str, float], dict[str, float]]:
        """(what the agent asked for, what the engine is sent) of the knobs that shape the sampled distribution."""
        fields = vars(req)
        asked = {k: fields[k] for k in NO_OP_SAMPLING if fields[k] is not None}
        honoured = self.engine.sampling_knobs
        used = dict(NO_OP_SAMPLING)
        if self.config.sampling == "agent":
            used |= {k: v for k, v in asked.items() if k in honoured}
        if used["top_k"] < 0:  # -1 and 0 both mean no top-k
            used["top_k"] = 0
        return asked, used

    async def stream(self, call: Call) -> AsyncIterator[str]:
        """Generate for a call, yielding text deltas; the call records the tokens as they arrive.

        Waits while a publish is under way. If a publish preempts the generation (engines that cannot swap
        weights under a running request), it continues on the new weights from the tokens already sampled, so
        the agent sees one uninterrupted response and every token keeps the version that sampled it. Any other
        abort (the engine stopped or restarted mid-call) fails the call with an EngineError: a response cut
        short must never reach the agent, or the trace, as a finished one.
        """
        rec, decoder = call.record, IncrementalDecoder(self.template)
        params = self.params(call.req)
        asked, used = self.knobs(call.req)
        if asked:  # recorded with the call: what the agent asked for, what the tokens were sampled with
            rec.sampling = {"asked": asked, "used": used}
        try:
            while True:
                await self._wait_for_publish()
                left = params.max_tokens - len(rec.response_ids)
                self._inflight[call.call_id] = call
                prompt = call.plan.prompt_ids + rec.response_ids
                version = self._pinned(call.session)
                routed = {"call": call} if self.engine.routes else {}  # a ReplicaSet places it
                if call.images:  # the engine expands each placeholder; its first delta says into what
                    routed["images"] = call.images
                async for delta in self.engine.generate(call.call_id, prompt, replace(params, max_tokens=left),
                                                        version=version, **routed):  # fmt: skip
                    if delta.finish_reason == "abort" and call.call_id in self._preempted:
                        break  # resumed below, on the new weights
                    call.add(delta)
                    self.tokens += len(delta.token_ids)
                    if delta.finish_reason == "abort":  # not asked for: the engine stopped or restarted under it
                        raise EngineError(
                            f"the {self.engine.name} engine aborted the generation (stopped or restarted)"
                        )
                    text = decoder.push(delta.token_ids)
                    if text:
                        yield text
                if call.call_id not in self._preempted:
                    break
                self._preempted.discard(call.call_id)
                if (rec.response_ids and rec.response_ids[-1] in self.template.stop_ids) or left <= 0:
                    break
            tail = decoder.flush()  # a reply cut inside a character: its last bytes, as the whole reply holds them
            if tail:
                yield tail
        except (EngineError, ContextLengthError) as e:
            call.fail(str(e))
            raise
        except (asyncio.CancelledError, GeneratorExit):
            await self.engine.abort(call.call_id)
            call.abort()
            raise
        finally:
            self._inflight.pop(call.call_id, None)

    async def _wait_for_publish(self) -> None:
        """While a publish is under way, new generations wait here; the most waiting at once is counted."""
        if self._open.is_set():
            return
        self._waiting += 1
        self.stats["proxy/queue_depth"] = max(self.stats["proxy/queue_depth"], self._waiting)
        try:
            await self._open.wait()
        finally:
            self._waiting -= 1

    def _pinned(self, session: Session) -> int | None:
        """`pin`: a session keeps the version its first call got, while the engine still holds it. A session opened
        with a version keeps it under any policy, and fails its call (an EngineError) rather than mix versions once
        the engine no longer holds it."""
        if self.config.version_policy != "pin" and not session.held_version:
            return None
        if session.pinned_version is None:
            session.pinned_version = self.engine.version
        loaded = self.engine.loaded_versions()
        if session.pinned_version not in loaded:
            if session.held_version:
                raise EngineError(
                    f"policy version {session.pinned_version}, which this session must keep, is no longer loaded by "
                    f"the {self.engine.name} engine (loaded: {sorted(loaded)})"
                )
            return None  # evicted: the rest of this trace follows the live policy (its versions say so)
        return session.pinned_version

    # ---- weight updates ------------------------------------------------------------------------------------
    async def publish(self, path: str, kind: str, version: int | None = None) -> int:
        """Publish new weights without agents noticing: new requests wait in the proxy (no error, no 429), and
        in-flight generations continue on the new weights (`mixed`) or stay on their pinned version (`pin`)."""
        self._open.clear()
        t0 = time.monotonic()
        try:
            in_place = self.engine.continues_in_place
            if self.config.version_policy == "mixed" and not in_place:
                self._preempted |= set(self._inflight)
                for call_id in list(self._inflight):
                    await self.engine.abort(call_id)
            new = await self.engine.publish(path, kind, version)  # type: ignore[arg-type]
        finally:
            if not self._held:
                self._open.set()
            self.stats["proxy/pause_s"] += time.monotonic() - t0
            self.stats["proxy/publishes"] += 1
        return new

    def finish(self, call: Call) -> ChatResult:
        """End a call that streamed to its end: parse what the model said (tool calls, reasoning, text)."""
        return call.finish(self.template)
