"""Does a real model keep every token through the four dialects? `hrl serve --model DIR` (the product's server, a
subprocess), then multi-turn conversations through each dialect's own SDK (OpenAI chat and responses, Anthropic
messages, Google GenAI), streamed and not, with a tool offered: each reply goes back into the history as that SDK
gives it (tool calls answered with a tool result), then the next user turn. Each session is ended over the control
route and its trace read back from `--traces`.

Per session: calls, roots (calls that do not extend an earlier call's prompt + sampled ids: 1 when nothing drifted),
training samples (branches), and the retained-token ratio (sampled ids trained at their own offsets ÷ ids sampled),
which must be 1.00. Then trainer vs engine parity: hrl's Trainer (the same weights, float32) re-scores every sampled
token of those samples, against the logprob the engine recorded when it sampled it. `hrl doctor --model DIR --engine
E` runs first (the template, the tool prompt and parser, the engine's own re-score), its checks kept in the card.

  PYTHONPATH=. python bench/real_model_dialects.py --out bench/results/real-model-dialects.json
  PYTHONPATH=. python bench/real_model_dialects.py --engine vllm --out bench/results/real-model-dialects-vllm.json
  PYTHONPATH=. python bench/real_model_dialects.py --model DIR --turns 2 --max-tokens 8 --out /tmp/d.json  # quick
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = "You are a helpful assistant. You may run shell commands with the bash tool."
ASKS = ["What is the capital of France? Answer in one sentence.", "And of Italy?", "List both again, comma-separated.",
        "Thanks. Which is larger?"]  # fmt: skip
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOL_RESULT = "ok"


# ---------------------------------------------------------------------------------------------------- the drivers
def chat(url: str, key: str, stream: bool, turns: int, max_tokens: int) -> list[str]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=600)
    tools: Any = [{"type": "function", "function": {"name": "bash", "description": "Run a command.",
                                                    "parameters": SCHEMA}}]  # fmt: skip
    msgs: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASKS[0]}]
    replies = []
    for turn in range(turns):
        kw: Any = {"model": "m", "messages": msgs, "tools": tools, "max_tokens": max_tokens}
        if stream:
            text, calls = "", {}
            for chunk in client.chat.completions.create(**kw, stream=True):
                delta = chunk.choices[0].delta if chunk.choices else None
                if delta is None:
                    continue
                text += delta.content or ""
                for tc in delta.tool_calls or []:
                    c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    c["id"] = tc.id or c["id"]
                    c["name"] += (tc.function.name or "") if tc.function else ""
                    c["arguments"] += (tc.function.arguments or "") if tc.function else ""
            msg: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                msg["tool_calls"] = [{"id": c["id"], "type": "function",
                                      "function": {"name": c["name"], "arguments": c["arguments"]}}
                                     for c in calls.values()]  # fmt: skip
        else:
            msg = client.chat.completions.create(**kw).choices[0].message.model_dump(exclude_none=True)
        msgs.append(msg)
        replies.append(msg.get("content") or json.dumps(msg.get("tool_calls")))
        for tc in msg.get("tool_calls") or []:
            msgs.append({"role": "tool", "tool_call_id": tc["id"], "content": TOOL_RESULT})
        if not msg.get("tool_calls"):
            msgs.append({"role": "user", "content": ASKS[(turn + 1) % len(ASKS)]})
    return replies


def responses(url: str, key: str, stream: bool, turns: int, max_tokens: int) -> list[str]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=600)
    tools: Any = [{"type": "function", "name": "bash", "description": "Run a command.", "parameters": SCHEMA}]
    items: list[Any] = [{"role": "user", "content": ASKS[0]}]
    replies = []
    for turn in range(turns):
        kw: Any = {
            "model": "m",
            "instructions": SYSTEM,
            "input": items,
            "tools": tools,
            "max_output_tokens": max_tokens,
        }
        if stream:
            ends = ("response.completed", "response.incomplete")  # incomplete: max_output_tokens reached
            response = [e.response for e in client.responses.create(**kw, stream=True) if e.type in ends][-1]
        else:
            response = client.responses.create(**kw)
        out = [o.model_dump(exclude_none=True) for o in response.output]
        for o in out:
            o.pop("status", None)
            if o.get("type") == "message":
                o.pop("id", None)
        items += out
        calls = [o for o in out if o.get("type") == "function_call"]
        replies.append(response.output_text or json.dumps(calls))
        items += [{"type": "function_call_output", "call_id": c["call_id"], "output": TOOL_RESULT} for c in calls]
        if not calls:
            items.append({"role": "user", "content": ASKS[(turn + 1) % len(ASKS)]})
    return replies


def messages(url: str, key: str, stream: bool, turns: int, max_tokens: int) -> list[str]:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=600)
    tools: Any = [{"name": "bash", "description": "Run a command.", "input_schema": SCHEMA}]
    msgs: list[Any] = [{"role": "user", "content": ASKS[0]}]
    replies = []
    for turn in range(turns):
        kw: Any = {"model": "m", "system": SYSTEM, "messages": msgs, "tools": tools, "max_tokens": max_tokens}
        if stream:
            with client.messages.stream(**kw) as s:
                reply = s.get_final_message()
        else:
            reply = client.messages.create(**kw)
        blocks = [b.model_dump(exclude_none=True) for b in reply.content]
        blocks = [{k: v for k, v in b.items() if k != "citations"} for b in blocks]
        msgs.append({"role": "assistant", "content": blocks})
        uses = [b for b in blocks if b["type"] == "tool_use"]
        replies.append("".join(b.get("text", "") for b in blocks) or json.dumps(uses))
        if uses:
            msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u["id"],
                                                      "content": TOOL_RESULT} for u in uses]})  # fmt: skip
        else:
            msgs.append({"role": "user", "content": ASKS[(turn + 1) % len(ASKS)]})
    return replies


def gemini(url: str, key: str, stream: bool, turns: int, max_tokens: int) -> list[str]:
    from google import genai
    from google.genai import types as gt

    client = genai.Client(api_key=key, http_options=gt.HttpOptions(
        base_url=url, timeout=600_000, retry_options=gt.HttpRetryOptions(attempts=1)))  # fmt: skip
    tool = gt.Tool(function_declarations=[gt.FunctionDeclaration(name="bash", description="Run a command.",
                                                                   parameters_json_schema=SCHEMA)])  # fmt: skip
    config = gt.GenerateContentConfig(system_instruction=SYSTEM, tools=[tool], max_output_tokens=max_tokens,
                                      automatic_function_calling=gt.AutomaticFunctionCallingConfig(disable=True))  # fmt: skip
    contents: list[Any] = [gt.Content(role="user", parts=[gt.Part(text=ASKS[0])])]
    replies = []
    for turn in range(turns):
        if stream:
            parts: list[Any] = []
            for chunk in client.models.generate_content_stream(model="m", contents=contents, config=config):
                for cand in chunk.candidates or []:
                    parts += (cand.content.parts or []) if cand.content else []
            merged: list[Any] = []  # streamed text arrives in pieces: one text part, as the SDK's callers keep it
            for p in parts:
                if p.text is not None and merged and merged[-1].text is not None and not p.thought:
                    merged[-1] = gt.Part(text=merged[-1].text + p.text)
                else:
                    merged.append(p)
            parts = merged
        else:
            reply = client.models.generate_content(model="m", contents=contents, config=config)
            parts = list(reply.candidates[0].content.parts or []) if reply.candidates else []
        contents.append(gt.Content(role="model", parts=parts))
        calls = [p.function_call for p in parts if p.function_call]
        replies.append("".join(p.text or "" for p in parts) or json.dumps([c.name for c in calls]))
        if calls:
            contents.append(gt.Content(role="user", parts=[gt.Part(function_response=gt.FunctionResponse(
                name=c.name, id=c.id, response={"output": TOOL_RESULT})) for c in calls]))  # fmt: skip
        else:
            contents.append(gt.Content(role="user", parts=[gt.Part(text=ASKS[(turn + 1) % len(ASKS)])]))
    return replies


DIALECTS: dict[str, Callable[..., list[str]]] = {"chat": chat, "responses": responses, "messages": messages,
                                                  "gemini": gemini}  # fmt: skip


# -------------------------------------------------------------------------------------------------- the server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def control(url: str, path: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"hrl serve exited {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"hrl serve not healthy after {timeout_s:.0f} s")


def session_figures(trace: dict[str, Any]) -> dict[str, Any]:
    from hrl.runners.trace import all_prompt_ids
    from hrl.train.samples import build_samples, retained_tokens

    calls, prompts = trace["calls"], all_prompt_ids(trace)
    samples = build_samples(trace)
    trained, sampled = retained_tokens(trace, samples)
    extends = 0  # calls whose prompt starts with the previous call's prompt and sampled ids, id for id
    for k in range(1, len(calls)):
        before = prompts[k - 1] + calls[k - 1]["response_ids"]
        extends += prompts[k][: len(before)] == before
    return {"calls": len(calls), "roots": sum("parent" not in c for c in calls), "extends_previous": extends,
            "branches": len(samples), "sampled": sampled, "trained": trained,
            "retained": round(trained / sampled, 4) if sampled else None,
            "finish": [c.get("finish_reason") for c in calls],
            "tool_prompt": sorted({str(c.get("tool_prompt")) for c in calls})}  # fmt: skip


def trainer_parity(model: str, traces: list[dict[str, Any]]) -> dict[str, Any]:
    """The trainer's logprobs (hrl's Trainer, the weights the engine serves, float32) of every sampled token of the
    sessions' training samples against the logprobs the engine recorded when it sampled them."""
    import torch

    from hrl.train.loss import mismatch_kl
    from hrl.train.samples import build_samples
    from hrl.train.trainer import Trainer, TrainerConfig

    samples = [s for t in traces for s in build_samples(t) if s.loss_tokens]
    trainer = Trainer(TrainerConfig(model=model, mode="lora", lora_rank=16))  # a fresh adapter: the base's logprobs
    try:
        mine = trainer.logprobs(samples)
    finally:
        trainer.close()
    engine = [torch.tensor([lp for lp, m in zip(s.behaviour_logprobs, s.loss_mask, strict=True) if m]) for s in samples]
    a, b = torch.cat(mine), torch.cat(engine)
    d = (a - b).abs()
    return {"tokens": int(d.numel()), "mean_abs": float(d.mean()), "max_abs": float(d.max()),
            **{k.removeprefix("train/"): v for k, v in mismatch_kl(a, b).items()}}  # fmt: skip


def doctor(model: str, engine: str, env: dict[str, str]) -> dict[str, Any]:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "hrl.cli", "doctor", "--model", model, "--engine", engine, "--json"],
                          capture_output=True, text=True, env=env, timeout=1800)  # fmt: skip
    try:
        checks = {c["name"]: c for c in json.loads(done.stdout)}
    except json.JSONDecodeError:
        return {"rc": done.returncode, "error": done.stderr[-1500:]}
    keep = ("tool prompt", "tool parser", "reasoning", "tool calls", "logprobs")
    return {"rc": done.returncode, "seconds": round(time.monotonic() - t0, 1),
            "checks": {k: {"ok": checks[k]["ok"], "detail": checks[k]["detail"],
                           **({"figures": checks[k]["figures"]} if checks[k].get("figures") else {})}
                       for k in keep if k in checks}}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="hrl:smollm2-135m", help="hrl:NAME, HF id or model dir")
    ap.add_argument("--engine", default="embedded", help="embedded | vllm (as hrl serve --engine)")
    ap.add_argument("--turns", type=int, default=3, help="model calls per conversation")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--no-doctor", action="store_true", help="skip `hrl doctor --model` (its parity figure)")
    ap.add_argument("--out", type=Path, default=None, help="write the card here (JSON)")
    args = ap.parse_args()
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {text}", flush=True)

    from hrl.cli.config import materialize_model

    model = materialize_model(args.model)
    checked = None if args.no_doctor else doctor(model, args.engine, env)
    if checked is not None:
        say(f"hrl doctor --model: rc {checked['rc']}; {json.dumps(checked.get('checks', checked))[:600]}")
    work = Path(tempfile.mkdtemp(prefix="hrl-dialects-"))
    port, token_file, traces = free_port(), work / "control", work / "traces.jsonl"
    url = f"http://127.0.0.1:{port}"
    serve = [sys.executable, "-m", "hrl.cli", "serve", "--model", model, "--engine", args.engine, "--port", str(port),
             "--traces", str(traces), "--control-token-file", str(token_file)]  # fmt: skip
    log = (work / "serve.log").open("wb")
    proc = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT, env=env)
    rows: list[dict[str, Any]] = []
    try:
        wait_healthy(url, proc, 900)
        token = token_file.read_text().strip()
        say(f"hrl serve --model {args.model} --engine {args.engine}: up on {url}")
        for name, drive in DIALECTS.items():
            for stream in (False, True):
                opened = control(url, "/sessions", token, {"token": f"dialects-{name}-{int(stream)}-" +
                                                                    secrets.token_hex(4)})  # fmt: skip
                t1 = time.monotonic()
                replies = drive(f"{url}{opened['base_path']}", opened["agent_key"], stream, args.turns,
                                args.max_tokens)  # fmt: skip
                control(url, f"{opened['base_path']}/end", token, {"reward": 1.0})
                rows.append({"dialect": name, "stream": stream, "token": opened["token"],
                             "seconds": round(time.monotonic() - t1, 1), "replies": replies})  # fmt: skip
                say(f"{name:<9} stream={stream!s:<5} {len(replies)} calls in {rows[-1]['seconds']} s: "
                    f"{[r[:40] for r in replies]}")  # fmt: skip
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    by_session = {t["session"]: t for t in map(json.loads, traces.read_text().splitlines())}
    for row in rows:
        trace = by_session.get(row["token"])
        row.update(session_figures(trace) if trace else {"error": "no trace for this session"})
    parity = trainer_parity(model, [by_session[r["token"]] for r in rows if r["token"] in by_session])
    say(f"trainer vs engine over {parity['tokens']} sampled tokens: mean |Δ| {parity['mean_abs']:.2e}, "
        f"max {parity['max_abs']:.2e}, KL {parity['mismatch_kl']:.2e}")  # fmt: skip
    for row in rows:
        row.pop("token")
    ok = all(r.get("retained") == 1.0 and r.get("roots") == 1 and r.get("extends_previous") == r.get("calls", 0) - 1
             for r in rows)  # fmt: skip
    card = {"schema": "hrl.real-model-dialects/1", "model": args.model, "engine": args.engine, "turns": args.turns,
            "max_tokens": args.max_tokens, "doctor": checked, "trainer_parity": parity, "sessions": rows, "every_token_kept": ok,
            "wall_s": round(time.monotonic() - t0, 1),
            "command": "PYTHONPATH=. python bench/real_model_dialects.py "
            + " ".join(os.path.relpath(a, ROOT) if a.startswith(str(ROOT)) else a for a in sys.argv[1:])}  # fmt: skip
    for r in rows:
        say(f"{r['dialect']:<9} stream={r['stream']!s:<5} calls {r.get('calls')} roots {r.get('roots')} "
            f"extends {r.get('extends_previous')} branches {r.get('branches')} retained {r.get('trained')}/"
            f"{r.get('sampled')} = {r.get('retained')}")  # fmt: skip
    say(f"every token kept: {ok}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(card, indent=1) + "\n")
        say(f"wrote {args.out}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
