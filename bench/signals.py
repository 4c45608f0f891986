"""Learning signals side by side on the CPU demo: GRPO (the verifier's reward spread over the episode), on-policy
distillation from a teacher (`distill.teacher`, the teacher's per-token signal alone) and turn credit
(`train.credit: turn`, progress per turn beside the reward), from one warm start, on the same held-out tasks, with the
same iterations, for one or more seeds. Every step is the product's own CLI in a subprocess (bench/demo_learning.py's
helpers):

  1. hrl rollout --recipe demo --tasks heldout.jsonl --model START -n K       held-out success before (once)
  2. per seed and arm: hrl train --recipe demo --model START -c train.seed=S [the arm's -c]
  3. hrl rollout ... --model RUN/checkpoints/vNNNN -n K                        held-out success after

The teacher (`--teacher DIR`) must have the student's tokenizer: the CPU case is the demo's own model after a
`hrl train --recipe demo` run (its last checkpoint), teaching the warm start it came from.

Usage: python bench/signals.py --arms grpo opd --teacher RUN/checkpoints/v0010 --seeds 0 1 2 -n 2 \
         --out bench/results/distill-demo.json
       python bench/signals.py --arms grpo turn --seeds 0 1 2 -n 2 --out bench/results/turn-credit-demo.json

Writes, after every run: {"arms": {ARM: {"heldout": {"before", "after", "n", "after_by_seed", "before_ci95",
"after_ci95"}, "runs": [...]}}, ...}: success rates over n held-out episodes each, with Wilson 95 % intervals.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_learning as demo  # a script beside this one, not a package

ARMS = {
    "grpo": [],
    "opd": ["train.advantage=distill"],  # + distill.teacher=--teacher
    "opd+grpo": [],  # the teacher's term beside the reward: + distill.teacher
    "turn": ["train.credit=turn"],
}


def wilson(successes: float, n: int, z: float = 1.96) -> list[float]:
    """The Wilson score interval of a success rate (95 % by default)."""
    if n == 0:
        return [0.0, 1.0]
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(centre - half, 4), round(centre + half, 4)]


def shown(path: Path, cache: Path) -> str:
    """A path as the result file keeps it: under $HRL_CACHE or the checkout, never this machine's absolute path."""
    path = path.resolve()
    for root, name in ((cache.resolve(), "$HRL_CACHE"), (demo.ROOT.resolve(), "")):
        if path.is_relative_to(root):
            rel = path.relative_to(root).as_posix()
            return f"{name}/{rel}" if name else rel
    return path.name


def heldout(runs: list[dict]) -> dict[str, object]:
    """An arm's held-out figures over its seeds: each seed's success after, with its Wilson interval, beside the
    start it was measured from (one evaluation per invocation; merged seeds keep their own)."""
    afters = [r["after"]["success"] for r in runs]
    befores = [r["before"]["success"] for r in runs]
    n = int(runs[-1]["after"]["episodes"])
    cis = [wilson(b * r["before"]["episodes"], r["before"]["episodes"]) for b, r in zip(befores, runs, strict=True)]
    after_cis = [wilson(a * n, n) for a in afters]
    return {
        "before": round(sum(befores) / len(befores), 4), "after": round(sum(afters) / len(afters), 4), "n": n,
        "seeds": [r["seed"] for r in runs], "before_by_seed": befores, "after_by_seed": afters,
        "before_ci95": cis[-1], "before_ci95_by_seed": cis, "after_ci95_by_seed": after_cis,
        "clear_of_start": [a[0] > b[1] for a, b in zip(after_cis, cis, strict=True)],
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=["grpo", "opd"])
    ap.add_argument("--teacher", default="", help="distill.teacher for the opd arms (the student's tokenizer)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--model-dir", type=Path, default=None, help="the warm start (default: the demo's tiny agent)")
    ap.add_argument("-n", type=int, default=2, help="episodes per held-out task in each evaluation (48 tasks)")
    ap.add_argument("-c", "--config", action="append", default=[], help="more `hrl train -c` for every arm")
    ap.add_argument("--work", type=Path, default=demo.ROOT / "runs" / "bench-signals")
    ap.add_argument("--start-traces", type=Path, default=None, help="reuse this before-evaluation's traces")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--merge", action="store_true", help="keep the runs already in --out (earlier seeds) and add these")
    args = ap.parse_args()
    if any(a.startswith("opd") for a in args.arms) and not args.teacher:
        ap.error("the opd arms need --teacher")

    cache = Path(os.environ.get("HRL_CACHE") or "~/.cache/hrl").expanduser()
    model = args.model_dir or cache / "models" / "tiny-agent"
    work = args.work / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    log = work / "bench.log"
    print(f"warm start {model}; work dir {work} (log: {log})", flush=True)
    demo.hrl("models", "tiny-agent", str(model), log=log)
    if args.start_traces:
        rate, episodes, _ = demo.success(args.start_traces)
        before = {"success": round(rate, 4), "episodes": episodes, "from": str(args.start_traces)}
    else:
        before = demo.evaluate(str(model), work / "eval-before.jsonl", args.n, log, str(model))
    print(f"before: held-out success {before['success']:.3f} over {before['episodes']} episodes", flush=True)
    result: dict[str, object] = {"model": shown(model, cache), "teacher": args.teacher, "cores": os.cpu_count(),
                                 "before": before, "config": args.config, "arms": {}}  # fmt: skip
    if args.merge and args.out and args.out.exists():  # earlier seeds, each run keeping the start it was measured from
        earlier = json.loads(args.out.read_text())
        for entry in earlier["arms"].values():
            for row in entry["runs"]:
                row.setdefault("before", earlier["before"])
                row.setdefault("config", earlier.get("config", []))
        result["arms"] = earlier["arms"]
        result["merged_from"] = {k: earlier[k] for k in ("before", "config", "teacher") if k in earlier}
    for seed in args.seeds:
        for arm in args.arms:
            run = work / f"{arm}-s{seed}"
            extra = ARMS[arm] + ([f"distill.teacher={args.teacher}"] if arm.startswith("opd") else [])
            overrides = [f"train.seed={seed}", f"trainer.seed={seed}", *extra, *args.config]
            wall, cpu = demo.hrl("train", "--recipe", "demo", "--model", str(model), "--run-dir", str(run),
                                 *[a for c in overrides for a in ("-c", c)], log=log)  # fmt: skip
            state = json.loads((run / "state.json").read_text())
            after = demo.evaluate(state["checkpoint"], work / f"eval-{arm}-s{seed}.jsonl", args.n, log, str(model))
            steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            row = {"seed": seed, "run_dir": shown(run, cache), "train_wall_s": wall, "train_cpu_s": cpu,
                   "before": before, "config": args.config,
                   "load_avg_1m": os.getloadavg()[0], "after": after,
                   "train_reward_per_iteration": [s.get("trace/reward") for s in steps],
                   **({"distill_reverse_kl_per_iteration": [s.get("distill/reverse_kl") for s in steps]}
                      if arm.startswith("opd") else {})}  # fmt: skip
            print(f"{arm} seed {seed}: held-out {before['success']:.3f} -> {after['success']:.3f}; train {wall:.0f} s",
                  flush=True)  # fmt: skip
            entry = result["arms"].setdefault(arm, {"runs": []})  # type: ignore[union-attr]
            entry["runs"].append(row)
            entry["heldout"] = heldout(entry["runs"])
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["arms"], indent=1))


if __name__ == "__main__":
    main()
