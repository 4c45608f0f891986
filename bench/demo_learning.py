"""Does the CPU demo learn? Held-out success of the warm-started tiny agent, a `hrl train --recipe demo` run, and
held-out success of the trained policy, for one or more RL seeds. Every step is the product's own CLI in a subprocess:

  1. hrl models tiny-agent DIR --seed S                                  (skipped when DIR holds that build)
  2. hrl rollout --recipe demo --tasks heldout.jsonl --model DIR -n K    start: mean reward on held-out tasks
  3. hrl train --recipe demo --model DIR --run-dir RUN -c train.seed=S   RL (the timed part)
  4. hrl rollout ... --model RUN/checkpoints/vNNNN                       end: the same held-out episodes

Usage: python bench/demo_learning.py --seeds 0 1 2 [--model-seed 0] [--out demo.json] [-n 2] [-c train.iterations=8]
       [--model-dir DIR --right-op 0.75 --in-place 0.25]   (a build other than the default; DIR is kept if it holds it)
One warm start (built once, evaluated once), then one RL run and one end evaluation per seed. Prints start/end
success and each run's wall time; writes them as JSON with --out (after every run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "demo"


def hrl(*args: str, log: Path) -> tuple[float, float]:
    """Run one hrl command (output to the log, its tail shown on failure); returns (wall s, CPU s of the command
    and everything it waited for: agent CLIs, graders)."""
    t0, cpu0 = time.monotonic(), _children_cpu()
    with log.open("a") as f:
        f.write(f"\n$ hrl {' '.join(args)}\n")
        f.flush()
        rc = subprocess.run([sys.executable, "-m", "hrl.cli", *args], stdout=f, stderr=f, check=False).returncode
    if rc not in (0, 3):
        tail = log.read_text()[-3000:]
        raise SystemExit(f"hrl {args[0]} failed (exit {rc}); end of {log}:\n{tail}")
    return round(time.monotonic() - t0, 1), round(_children_cpu() - cpu0, 1)


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def success(traces: Path) -> tuple[float, int, dict[str, int]]:
    """Mean reward over episodes (an episode without a reward counts as a failure) and failure reasons."""
    rows = [json.loads(line) for line in traces.read_text().splitlines() if line.strip()]
    reasons: dict[str, int] = {}
    for t in rows:
        key = t.get("failure_reason") or "ok"
        reasons[key] = reasons.get(key, 0) + 1
    return sum(float(t.get("reward") or 0.0) for t in rows) / max(1, len(rows)), len(rows), reasons


def behaviour(traces: Path, tokenizer_dir: str) -> dict[str, float]:
    """What the episodes did, from the sampled tokens: the share that wrote the fix (`sed -i`, not a `sed` that only
    prints it), the success rate among those (picking the right operator), and the share of 3-call episodes."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    rows = [json.loads(line) for line in traces.read_text().splitlines() if line.strip()]
    texts = ["".join(tok.decode(c["response_ids"]) for c in t["calls"]) for t in rows]
    in_place = [t for t, text in zip(rows, texts, strict=True) if "sed -i" in text]
    return {
        "sed_in_place": round(len(in_place) / max(1, len(rows)), 3),
        "success_given_in_place": round(
            sum(float(t.get("reward") or 0.0) for t in in_place) / max(1, len(in_place)), 3
        ),
        "three_calls": round(sum(len(t["calls"]) == 3 for t in rows) / max(1, len(rows)), 3),
    }


def evaluate(model: str, out: Path, n: int, log: Path, tokenizer_dir: str) -> dict[str, object]:
    out.unlink(missing_ok=True)
    wall, cpu = hrl("rollout", "--agent", "mini-swe-agent", "--recipe", "demo", "--tasks", str(RECIPE / "heldout.jsonl"),
                    "--model", model, "-n", str(n), "--out", str(out), log=log)  # fmt: skip
    rate, episodes, reasons = success(out)
    return {"success": round(rate, 4), "episodes": episodes, "failures": reasons, "wall_s": wall, "cpu_s": cpu,
            **behaviour(out, tokenizer_dir)}  # fmt: skip


def _what(ev: dict[str, object]) -> str:
    return f"sed -i in {ev['sed_in_place']:.0%} of episodes, right operator given -i {ev['success_given_in_place']:.0%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds of the RL runs (one run each)")
    ap.add_argument("--model-seed", type=int, default=0, help="seed of the tiny-agent build (the warm start)")
    ap.add_argument("--model-dir", type=Path, default=None, help="default: $HRL_CACHE/models/tiny-agent-s<seed>")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-demo", help="run dirs, traces and logs")
    ap.add_argument("-n", type=int, default=2, help="episodes per held-out task in each evaluation")
    ap.add_argument("--end-n", type=int, default=None, help="episodes per held-out task at the end (default: -n)")
    ap.add_argument("-c", "--config", action="append", default=[], help="extra `hrl train -c` overrides")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    ap.add_argument("--right-op", type=float, default=None, help="`hrl models tiny-agent --right-op` of the build")
    ap.add_argument("--in-place", type=float, default=None, help="`hrl models tiny-agent --in-place` of the build")
    ap.add_argument("--start-traces", type=Path, default=None, help="reuse this start evaluation (its traces file)")
    args = ap.parse_args()

    cache = Path(os.environ.get("HRL_CACHE") or "~/.cache/hrl").expanduser()
    model = args.model_dir or cache / "models" / f"tiny-agent-s{args.model_seed}"
    work = args.work / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    log = work / "bench.log"
    print(f"warm start {model} (seed {args.model_seed}); work dir {work} (log: {log})", flush=True)

    noise = [a for flag, v in (("--right-op", args.right_op), ("--in-place", args.in_place)) if v is not None
             for a in (flag, str(v))]  # fmt: skip
    build_wall, build_cpu = hrl("models", "tiny-agent", str(model), "--seed", str(args.model_seed), *noise, log=log)
    if args.start_traces:  # the warm start's evaluation from an earlier run of this script
        rate, episodes, reasons = success(args.start_traces)
        start = {"success": round(rate, 4), "episodes": episodes, "failures": reasons, "from": str(args.start_traces),
                 **behaviour(args.start_traces, str(model))}  # fmt: skip
    else:
        start = evaluate(str(model), work / "eval-start.jsonl", args.n, log, str(model))
    print(
        f"start: held-out success {start['success']:.3f} over {start['episodes']} episodes; {_what(start)}", flush=True
    )
    result: dict[str, object] = {
        "model": str(model), "model_seed": args.model_seed, "build_wall_s": build_wall, "build_cpu_s": build_cpu,
        "cores": os.cpu_count(), "start": start, "runs": [],
    }  # fmt: skip
    for seed in args.seeds:
        run = work / f"run-s{seed}"
        overrides = [f"train.seed={seed}", f"trainer.seed={seed}", *args.config]
        train_wall, train_cpu = hrl("train", "--recipe", "demo", "--model", str(model), "--run-dir", str(run),
                                    *[a for c in overrides for a in ("-c", c)], log=log)  # fmt: skip
        print(f"seed {seed}: train {train_wall:.0f} s wall, {train_cpu:.0f} s CPU; run dir {run}", flush=True)
        state = json.loads((run / "state.json").read_text())
        end_n = args.end_n or args.n
        end = evaluate(state["checkpoint"], work / f"eval-end-s{seed}.jsonl", end_n, log, str(model))
        rewards = [json.loads(line).get("trace/reward") for line in (run / "metrics.jsonl").read_text().splitlines()]
        ratio = round(float(end["success"]) / max(float(start["success"]), 1e-9), 2)  # type: ignore[arg-type]
        print(f"seed {seed}: held-out success {start['success']:.3f} -> {end['success']:.3f} ({ratio}x); {_what(end)}; "
              f"train reward per iteration {[round(r or 0.0, 3) for r in rewards]}", flush=True)  # fmt: skip
        result["runs"].append(  # type: ignore[union-attr]
            {"seed": seed, "run_dir": str(run), "train_wall_s": train_wall, "train_cpu_s": train_cpu,
             "load_avg_1m": os.getloadavg()[0], "end": end, "ratio": ratio, "train_reward_per_iteration": rewards}
        )  # fmt: skip
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
