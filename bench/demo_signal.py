"""Which choice gives the CPU demo's early iterations a gradient? Short `hrl train --recipe demo` runs, one per variant
and seed, side by side: the share of GRPO groups with signal (rewards that differ) per iteration, and the reward.

  python bench/demo_signal.py                                   # the recipe, signal sampling by operator, groups of 8
  python bench/demo_signal.py --seeds 0 1 2 --iterations 5 --parallel 2
  python bench/demo_signal.py --variant uniform= --variant g8=train.group_size=8,train.tasks_per_iteration=2

A variant is NAME=KEY=VALUE[,KEY=VALUE…] (`-c` overrides of the recipe; empty = the recipe as it is). Every run is
the product's own CLI in a subprocess; the figures come from each run's metrics.jsonl. `--out FILE` writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DEFAULT_VARIANTS = [
    "uniform=train.task_sampler=uniform",  # the recipe: 4 tasks x 4 episodes
    "signal-op=train.task_sampler=signal,train.sampler_key=demo.op",  # tasks weighted by their operator's signal
    "g8=train.group_size=8,train.tasks_per_iteration=2",  # the same 16 episodes as 2 groups of 8
]


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, _, overrides = text.partition("=")
    if not name:
        raise SystemExit(f"--variant {text!r}: give NAME=KEY=VALUE[,KEY=VALUE…] (or NAME= for the recipe as it is)")
    return name, [o for o in overrides.split(",") if o]


def run_one(name: str, overrides: list[str], seed: int, iterations: int, work: Path, extra: list[str]) -> dict:
    run = work / f"{name}-s{seed}"
    args = ["train", "--recipe", "demo", "--iterations", str(iterations), "--run-dir", str(run),
            "-c", f"train.seed={seed}", "-c", "eval_tasks=",  # the training curve only: no held-out evaluations
            *[a for o in overrides for a in ("-c", o)], *extra]  # fmt: skip
    t0 = time.monotonic()
    log = work / f"{name}-s{seed}.log"
    with log.open("w") as f:
        rc = subprocess.run([sys.executable, "-m", "hrl.cli", *args], stdout=f, stderr=f, check=False).returncode
    if rc != 0:
        raise SystemExit(f"{name} seed {seed}: hrl train exited {rc}; end of {log}:\n{log.read_text()[-2000:]}")
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {
        "variant": name,
        "seed": seed,
        "overrides": overrides,
        "wall_s": round(time.monotonic() - t0, 1),
        "groups_with_signal": [round(float(m.get("train/groups_with_signal", 0.0)), 3) for m in steps],
        "reward": [None if m.get("trace/reward") is None else round(float(m["trace/reward"]), 3) for m in steps],
    }


def table(rows: list[dict]) -> str:
    n = max((len(r["groups_with_signal"]) for r in rows), default=0)
    head = f"{'variant':<10} {'seed':>4}  {'groups with signal per iteration':<{7 * n}} {'mean':>5}  {'reward per iteration':<{7 * n}} wall s"
    lines = [head, "-" * len(head)]
    for r in rows:
        share, reward = r["groups_with_signal"], r["reward"]
        mean = sum(share) / max(len(share), 1)
        lines.append(
            f"{r['variant']:<10} {r['seed']:>4}  {''.join(f'{x:>7.2f}' for x in share):<{7 * n}} {mean:>5.2f}  "
            f"{''.join('      -' if x is None else f'{x:>7.3f}' for x in reward):<{7 * n}} {r['wall_s']:>6.0f}"
        )
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r["variant"], []).extend(r["groups_with_signal"])
    lines.append("")
    lines += [f"{name}: mean share of groups with signal {sum(v) / max(len(v), 1):.3f} over {len(v)} steps"
              for name, v in by.items()]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", default=None, help="NAME=KEY=VALUE[,…]; repeat (default: "
                    "the recipe, signal sampling by operator family, 2 groups of 8)")  # fmt: skip
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--parallel", type=int, default=1, help="runs at once")
    ap.add_argument("--model", default="", help="model (default: the recipe's hrl:tiny-agent)")
    ap.add_argument("--work", type=Path, default=None, help="keep the run directories and logs here")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    a = ap.parse_args()
    variants = [parse_variant(v) for v in (a.variant or DEFAULT_VARIANTS)]
    work = a.work or Path(tempfile.mkdtemp(prefix="hrl-demo-signal-"))
    work.mkdir(parents=True, exist_ok=True)
    extra = ["--model", a.model] if a.model else []
    jobs = [(name, o, seed) for seed in a.seeds for name, o in variants]
    print(f"{len(jobs)} runs of {a.iterations} iterations ({a.parallel} at once); runs and logs in {work}",
          file=sys.stderr)  # fmt: skip
    with ThreadPoolExecutor(max(1, a.parallel)) as pool:
        rows = list(pool.map(lambda j: run_one(j[0], j[1], j[2], a.iterations, work, extra), jobs))
    print(table(rows))
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
