"""Trace size and training tokens for a long agent session: a 30-turn tool-calling conversation through the real
proxy. Reports trace bytes per token, and the tokens a trainer processes when the trace is merged into one
sample per branch vs one sample per call (the linear ideal is the final context length).

"Tokens" counts what the session processed: every call's prompt + response tokens (what a per-call log would
store). Prompt delta-encoding keeps the trace linear in the conversation.

    python bench/trace_size.py --model DIR [--turns 30]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.proxy_helpers import running_proxy  # the same in-thread proxy the tests use

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]  # fmt: skip


def main(a: argparse.Namespace) -> None:
    turns = [{"text": f"Step {i}: checking.", "tool_calls": [{"name": "bash", "arguments": {"command": f"cat f{i}.py"}}]}
             for i in range(a.turns - 1)] + ["Done: fixed."]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "t.jsonl"
        with running_proxy(a.model, traces=str(out), engine_options={"turns": turns}) as p:
            msgs = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "fix the bug in f.py"}]
            for i in range(a.turns):
                r = httpx.post(f"{p.url}/s/b/v1/chat/completions", json={"messages": msgs, "tools": TOOLS}, timeout=60)
                msg = r.json()["choices"][0]["message"]
                msgs.append({k: v for k, v in msg.items() if v is not None})
                for tc in msg.get("tool_calls") or []:
                    msgs.append(
                        {"role": "tool", "tool_call_id": tc["id"], "content": f"def f{i}(x):\n    return x + 1\n"}
                    )
            p.end("b")
        line = out.read_text().splitlines()[0]
    trace = json.loads(line)
    from hrl.runners.trace import all_prompt_ids
    from hrl.train.samples import build_samples

    prompts = all_prompt_ids(trace)
    processed = sum(len(pr) + len(c["response_ids"]) for pr, c in zip(prompts, trace["calls"], strict=True))
    final = len(prompts[-1]) + len(trace["calls"][-1]["response_ids"])
    print(json.dumps({
        "turns": len(trace["calls"]), "trace_bytes": len(line), "tokens_processed": processed,
        "bytes_per_token": round(len(line) / processed, 3), "final_context_tokens": final,
        "bytes_per_distinct_token": round(len(line) / final, 3),
        "train_tokens_one_sample_per_call": processed,
        "train_tokens_merged": sum(len(s.input_ids) for s in build_samples(trace)),
        "train_tokens_linear_ideal": final,
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--turns", type=int, default=30)
    main(ap.parse_args())
