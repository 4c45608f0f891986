"""Redactor throughput: `Redactor.text` on an encoded trace line and on plain code/log text, and `Redactor.obj` on
the decoded trace (what `TraceWriter.write` and the proxy run), with N planted env secrets and a few planted keys.
Best of --repeat runs.

    python bench/redact_speed.py [--mb 10] [--secrets 20]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from hrl.runners.redact import Redactor

ROOT = Path(__file__).resolve().parents[1]
PLANTED = " sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z AKIAABCDEFGHIJKLMNOP ghp_" + "a1" * 18 + " "


def corpus(n_bytes: int) -> str:
    """Code and prose of this repository, repeated, with a planted key every ~100 kB."""
    text = "".join(p.read_text() for p in sorted((ROOT / "runners").rglob("*.py")))
    text = "".join(text[i : i + 100_000] + PLANTED for i in range(0, len(text), 100_000))
    return (text * (n_bytes // len(text) + 1))[:n_bytes]


def trace(n_bytes: int, rng: random.Random) -> dict[str, object]:
    """A trace of about n_bytes encoded: half token ids and logprobs, half text (patch, agent output, test log)."""
    text = corpus(n_bytes // 2)
    calls, size = [], 0
    while size < n_bytes // 2:
        ids = [rng.randrange(150_000) for _ in range(2000)]
        calls.append({"call_id": f"c{len(calls)}", "prompt_ids": ids, "response_ids": ids[:300],
                      "response_logprobs": [-rng.random() for _ in range(300)], "versions": [[0, 1]]})  # fmt: skip
        size += len(json.dumps(calls[-1]))
    third = len(text) // 3
    meta = {"patch": text[:third], "agent_stdout_tail": text[third : 2 * third]}
    return {"calls": calls, "metadata": meta, "reward_info": {"log": text[2 * third :]}, "tools": [{"name": "bash"}]}


def best(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return min(times)


def main(a: argparse.Namespace) -> None:
    rng = random.Random(0)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    env = {f"SVC{i}_API_KEY": "".join(rng.choice(alphabet) for _ in range(40)) for i in range(a.secrets)}
    red = Redactor.from_env(env)
    n = int(a.mb * 1e6)
    text, tr = corpus(n), trace(n, rng)
    line = json.dumps(tr)
    rows = {
        "text(code and logs)": (len(text), best(lambda: red.text(text), a.repeat)),
        "text(encoded trace line)": (len(line), best(lambda: red.text(line), a.repeat)),
        "obj(decoded trace)": (len(line), best(lambda: red.obj(tr), a.repeat)),
    }
    found = red.text(text).count("[REDACTED:")
    for name, (size, seconds) in rows.items():
        print(f"{name:28s} {size / 1e6:6.1f} MB  {seconds * 1e3:7.1f} ms  {size / 1e6 / seconds:7.1f} MB/s")
    print(f"{a.secrets} env secrets + {len(red._labels) - a.secrets} key patterns; {found} redactions in the text")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=10.0, help="size of each input in MB")
    p.add_argument("--secrets", type=int, default=20, help="env secrets planted in the redactor")
    p.add_argument("--repeat", type=int, default=3)
    main(p.parse_args())
