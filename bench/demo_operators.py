"""Which operator does the CPU demo's policy write? Reads the held-out evaluations of `hrl train --recipe demo` runs
(RUN/eval/step-*.jsonl) and classifies each episode's fix from its sampled tokens, against the task's own bug:

  right   `sed [-i] 's/ BUG / OP /' …` with the task's correct operator OP
  same    the buggy operator written back (a fix that changes nothing)
  other   another operator (e.g. `*` for `+`)
  miss    a pattern that is not the buggy operator (the sed changes nothing)
  none    no `sed 's/…/…/'` at all (another command, or a malformed one)

and whether that sed writes the file (`-i`) or only prints it. Success needs both: `-i` and the right operator. The
skill RL has to learn per task is the operator; the in-place habit is one token, the same on every task.

`--by-bug` pools the runs' first and last evaluations, and their training episodes, and splits them by the operator
in the code: what the policy writes after `s/ BUG /`, for each BUG, and how many training episodes were rewarded.
A policy that learnt the mapping raises `right` for both operators of a mirror pair; one that learnt to prefer a
token raises `right` for one and `same` for the other (it writes `+` after `-` and after `+`).

  python bench/demo_operators.py RUN [RUN ...] [--json] [--by-bug]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

from hrl.runners.tasks import load_tasks
from hrl.train.heldout import sampled_text
from hrl.train.tiny.tasks import MIRROR, task_bug

ROOT = Path(__file__).resolve().parents[1]
CHOICES = ("right", "same", "other", "miss", "none")
SED = re.compile(r"sed (-i )?'s/ ?([^/]*?)\(? ?/ ?([^/]*?)\(? ?/")  # the first substitution: (-i, pattern, replacement)


def classify(text: str, bug) -> tuple[str, bool]:
    """(choice, in place) of the first `sed 's/…/…/'` in an episode's sampled text."""
    m = SED.search(text)
    if m is None:
        return "none", False
    pattern, replacement = m[2].strip(), m[3].strip()
    choice = ("miss" if pattern != bug.bug else "right" if replacement == bug.op
              else "same" if replacement == bug.bug else "other")  # fmt: skip
    return choice, bool(m[1])


def step_row(path: Path, bugs: dict, decode) -> dict:
    traces = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [(classify(sampled_text(t, decode), bugs[t["task_id"]]), float(t.get("reward") or 0.0)) for t in traces]
    n = max(1, len(rows))
    in_place = [(c, r) for (c, ip), r in rows if ip]
    return {
        "step": int(path.stem.split("-")[1]),
        "episodes": len(rows),
        "success": round(sum(r for _, r in rows) / n, 3),
        **{c: round(sum(choice == c for (choice, _), _ in rows) / n, 3) for c in CHOICES},
        "in_place": round(len(in_place) / n, 3),
        "right_given_in_place": round(sum(c == "right" for c, _ in in_place) / max(1, len(in_place)), 3),
    }


def by_bug(runs: list[Path], bugs: dict, train_bugs: dict, decode) -> list[dict]:
    """Per buggy operator, pooled over `runs`: the choices of each run's first and last held-out evaluation, and the
    training episodes (RUN/traces) of that operator, with how many were rewarded: the operator's whole signal."""
    table: dict[tuple[str, str], Counter] = {}
    for run in runs:
        files = sorted((run / "eval").glob("step-*.jsonl"))
        sources = [("first", files[0], bugs), ("last", files[-1], bugs)]
        sources += [("train", f, train_bugs) for f in sorted((run / "traces").glob("iter-*.jsonl"))]
        for when, path, known in sources:
            for line in path.read_text().splitlines():
                t = json.loads(line) if line.strip() else {}
                if (bug := known.get(t.get("task_id"))) is None:
                    continue
                choice, _ = classify(sampled_text(t, decode), bug)
                counts = table.setdefault((bug.bug, when), Counter())
                counts[choice] += 1
                counts["rewarded"] += float(t.get("reward") or 0.0) >= 1.0
    order = {"first": 0, "last": 1, "train": 2}
    return [{"bug": b, "eval": w, "episodes": sum(c[k] for k in CHOICES), **{k: c[k] for k in (*CHOICES, "rewarded")}}
            for (b, w), c in sorted(table.items(), key=lambda kv: (_PAIRS.index(kv[0][0]), order[kv[0][1]]))]  # fmt: skip


_PAIRS = list(MIRROR)  # mirror pairs side by side


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+", help="run directories of hrl train --recipe demo")
    ap.add_argument("--tasks", type=Path, default=ROOT / "recipes" / "demo" / "heldout.jsonl")
    ap.add_argument("--train-tasks", type=Path, default=ROOT / "recipes" / "demo" / "tasks.jsonl")
    ap.add_argument("--tokenizer", default="", help="tokenizer dir (default: the shipped tiny agent model)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--by-bug", action="store_true", help="the first and last evaluations, pooled, per buggy operator")
    a = ap.parse_args()
    from transformers import AutoTokenizer

    from hrl.train.tiny import shipped_model

    tok = AutoTokenizer.from_pretrained(a.tokenizer or str(shipped_model()))
    bugs = {t.instance_id: task_bug(t) for t in load_tasks(a.tasks)}
    for run in a.runs:
        if not any((run / "eval").glob("step-*.jsonl")):
            sys.exit(f"{run}: no held-out evaluations (eval/step-*.jsonl)")
    if a.by_bug:
        train_bugs = {t.instance_id: task_bug(t) for t in load_tasks(a.train_tasks)}
        rows = by_bug(a.runs, bugs, train_bugs, tok.decode)
        if a.json:
            print(json.dumps(rows, indent=1))
            return
        print(f"{'bug':<5} {'what':<5} {'eps':>4} " + " ".join(f"{c:>6}" for c in (*CHOICES, "rewarded")))
        for r in rows:
            print(f"{r['bug']:<5} {r['eval']:<5} {r['episodes']:>4} "
                  + " ".join(f"{r[c]:>6}" for c in (*CHOICES, "rewarded")))  # fmt: skip
        return
    out = [{"run": str(run), **step_row(f, bugs, tok.decode)} for run in a.runs
           for f in sorted((run / "eval").glob("step-*.jsonl"))]  # fmt: skip
    if a.json:
        print(json.dumps(out, indent=1))
        return
    head = f"{'run':<28} {'step':>4} {'eps':>4} {'success':>7} " + " ".join(f"{c:>6}" for c in CHOICES)
    head += f" {'-i':>6} {'right|-i':>8}"
    print(head)
    for r in out:
        print(f"{Path(r['run']).name:<28} {r['step']:>4} {r['episodes']:>4} {r['success']:>7.3f} "
              + " ".join(f"{r[c]:>6.3f}" for c in CHOICES) + f" {r['in_place']:>6.3f} {r['right_given_in_place']:>8.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
