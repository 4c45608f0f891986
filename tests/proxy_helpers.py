"""Run the real serving stack (real HTTP, real template and tokenizer) on an event loop in a background thread, for
synchronous tests."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from hrl.runners.proxy.proxy import Proxy
from hrl.runners.serving.stack import Stack, serving
from hrl.runners.trace import TraceWriter

CONTROL_TOKEN = "test-control-token-0123456789abcdef"

# Two tools an agent offers: a shell, and a file writer whose description and arguments stretch the templates
# (non-ASCII text, a nested object).
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file — écrit un fichier (写文件)",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"},
                    "options": {"type": "object"},
                },
                "required": ["path", "content"],
            },
        },
    },
]

# SmolLM2-Instruct's chat template, verbatim: plain ChatML, which shows no tool (proxy.tool_prompt decides what happens to them)
PLAIN_CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>'"
    " + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt"
    " %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class RunningProxy:
    def __init__(self, proxy: Proxy, url: str, loop: asyncio.AbstractEventLoop) -> None:
        self.proxy, self.url, self.loop = proxy, url, loop
        self.control = {"Authorization": f"Bearer {CONTROL_TOKEN}"}  # headers for the control routes

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run fn(*args) on the proxy's event loop thread (the proxy is not thread-safe)."""

        async def run() -> Any:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def call_async(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Start coroutine fn(*args) on the proxy's loop; returns a concurrent Future."""
        return asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), self.loop)

    def end(self, token: str, **outcome: Any) -> dict[str, Any]:
        return self.call(self.proxy.end_session, token, **outcome)


@contextlib.contextmanager
def running_proxy(
    model: str,
    engine: str = "scripted",
    traces: str | None = None,
    engine_options: dict[str, Any] | None = None,
    model_name: str = "model",
    **config: Any,
) -> Iterator[RunningProxy]:
    """`serving(model, engine)` in a thread; `config` holds ProxyConfig fields, `traces` a JSONL path. Tests name
    ad-hoc session tokens, so sessions open on first use unless `open_sessions=False` is passed; the control routes
    take `RunningProxy.control` as headers."""
    config = {"open_sessions": True, **config}
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> None:
        state["task"] = asyncio.current_task()
        writer = TraceWriter(traces) if traces else None
        opts = {"model_name": model_name, "engine_options": engine_options, "proxy_options": config, "traces": writer,
                "control_token": CONTROL_TOKEN}  # fmt: skip
        async with serving(model, engine, **opts) as stack:
            state["stack"] = stack
            ready.set()
            await asyncio.Event().wait()  # until cancelled: serving then ends open sessions and stops

    def thread() -> None:
        try:
            loop.run_until_complete(main())
        except asyncio.CancelledError:
            pass
        except BaseException as e:  # a failed start: raised in the test's thread below
            state["error"] = e
        finally:
            ready.set()

    t = threading.Thread(target=thread, daemon=True)
    t.start()
    assert ready.wait(120), "proxy did not start"
    if "error" in state:
        raise state["error"]
    stack: Stack = state["stack"]
    try:
        yield RunningProxy(stack.proxy, stack.url, loop)
    finally:
        loop.call_soon_threadsafe(state["task"].cancel)
        t.join(30)
