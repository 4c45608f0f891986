"""Write the golden `hrl.trace/1` files and what they must turn into (samples, a loss), from the real proxy.

    python -m tests.golden.make            # from the repository root; overwrites tests/golden/*.jsonl, expected.json

Each dialect, streaming and not, runs a three-call tool conversation through its official SDK (the same drivers as
tests/runners/proxy/test_sdks.py) against the real proxy, the scripted engine and the tiny model's tokenizer (seed 0). The
chat sessions also send a request that forks after the first call (another tool result: a branch), and the
streaming chat session has a response sampled across a publish (versions 0 and 1). Regenerate only on a deliberate
change of the contract; `tests/runners/test_trace_golden.py` pins today's files.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import httpx

from tests.golden.expected import batch_loss, expected_for
from tests.proxy_helpers import running_proxy
from tests.runners.proxy.test_sdks import DRIVERS, SCRIPT

HERE = Path(__file__).parent
LONG = "a long answer, sampled one token at a time while new weights arrive " * 3


def _fork(url: str, stream: bool) -> None:
    """Call 1's messages + its reply + a different tool result: extends call 1 a second time (a branch)."""
    first = {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls -la"}'}}
        ],
    }
    msgs = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "fix the tests"}, first,
            {"role": "tool", "tool_call_id": "call_0", "content": "no such file"}]  # fmt: skip
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": msgs, "stream": stream, "tools": _TOOLS}, timeout=60)
    r.raise_for_status()


_TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]  # fmt: skip


def _across_publish(p, token: str) -> None:
    """A streamed response during which the proxy publishes new weights: its tokens carry versions 0 then 1."""
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello."},
    ] * 2  # turn 3: the long one
    body = {
        "messages": [*history, {"role": "user", "content": "write a long answer"}],
        "stream": True,
        "max_tokens": 200,
    }
    published = None
    with httpx.stream("POST", f"{p.url}/s/{token}/v1/chat/completions", json=body, timeout=60) as r:
        for n, _ in enumerate(r.iter_lines()):
            if n == 20 and published is None:
                published = p.call_async(p.proxy.publish, "unused", "lora")
    assert published is not None
    published.result(30)


def main() -> None:
    from hrl.train.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_tiny_model(Path(tmp) / "tiny", seed=0))
        turns = [*SCRIPT[:2], SCRIPT[2] + " " + LONG]
        for old in HERE.glob("*.jsonl"):
            old.unlink()
        for dialect, drive in DRIVERS.items():
            for stream in (False, True):
                name = f"{dialect}-{'sse' if stream else 'json'}"
                opts = {"turns": turns, "token_delay_s": 0.002}
                with running_proxy(model, traces=str(HERE / f"{name}.jsonl"), engine_options=opts) as p:
                    drive(f"{p.url}/s/{name}", stream)
                    if dialect == "chat":
                        _fork(f"{p.url}/s/{name}", stream)
                        if stream:
                            _across_publish(p, name)
                    p.end(name, reward=1.0 if stream else 0.0, reward_info={"golden": True})
    files = sorted(HERE.glob("*.jsonl"))
    expected = {"files": {f.name: expected_for(f) for f in files}, "batch_loss": batch_loss(files)}
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(files)} golden trace files and expected.json to {HERE}")


if __name__ == "__main__":
    main()
