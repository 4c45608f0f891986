"""How sure is the CPU demo's policy of the operator? A probe of the operator choice by teacher forcing: no
sampling noise, so one model is measured exactly on the same prompts.

For each episode of a held-out evaluation (RUN/eval/step-NNNN.jsonl), the call that wrote `sed … 's/ P / R /'` is
replayed up to its pattern, and the model scores each of the 8 operators there (log-probability of ` X /`,
normalised over the 8): `p(pattern)` is the probability of the code's operator. Then after `s/ BUG / `, the
replacements are scored the same way: `p(replacement)` is the probability of the right one, MIRROR[BUG]. Their
product is the chance that a sampled fix names the right operator; `argmax` rows say how often the most likely
operator is right. The same prompts (the first evaluation's, by default) serve every model, so the warm start and
each run's checkpoint are compared on identical inputs.

  python bench/demo_reading.py RUN [--model DIR ...] [--step N] [--json]   # --model: checkpoint (LoRA) or model dir
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from hrl.runners.tasks import load_tasks
from hrl.runners.trace import call_prompt_ids
from hrl.train.tiny.tasks import MIRROR, task_bug

ROOT = Path(__file__).resolve().parents[1]
OPS = list(MIRROR)


def load(model_dir: str):
    """(model, tokenizer): a model dir, or a LoRA checkpoint over the base its adapter config names
    (`split_adapter`, as `hrl rollout -m` takes one); '' = the shipped tiny agent."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hrl.runners.models import peft_quietly, split_adapter
    from hrl.train.tiny import shipped_model

    base, adapter = split_adapter(model_dir or str(shipped_model()))
    model = AutoModelForCausalLM.from_pretrained(base)
    if adapter:
        from peft import PeftModel

        with peft_quietly():
            model = PeftModel.from_pretrained(model, adapter)
    return model.eval(), AutoTokenizer.from_pretrained(base)


@torch.no_grad()
def scores(model, prefix: list[int], options: list[list[int]]) -> list[float]:
    """log P(option | prefix) for each option's token ids, one batch."""
    seqs = [prefix + o for o in options]
    width = max(len(s) for s in seqs)
    ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
    return [sum(float(logp[i, len(prefix) + j - 1, t]) for j, t in enumerate(o)) for i, o in enumerate(options)]


def _probs(model, tok, context: str, gap: str, before: str) -> list[float]:
    """The 8 operators' probabilities (normalised over them) as the next ` X /` after `context + before`; the
    context is the call's prompt and sampled head as text, encoded again."""
    start = tok.encode(context + before, add_special_tokens=False)
    opts = [tok.encode(context + before + f"{gap}{op} /", add_special_tokens=False)[len(start) :] for op in OPS]
    return torch.softmax(torch.tensor(scores(model, start, opts)), 0).tolist()


def probe(trace: dict, bug, model, tok) -> dict | None:
    """The operator probabilities of one episode (see the module docstring); None without a `sed 's/` call."""
    for i, call in enumerate(trace.get("calls") or []):
        text = tok.decode(call["response_ids"])
        if "'s/" not in text:
            continue
        head = text[: text.index("'s/") + len("'s/")]  # the sampled text up to the pattern
        context = tok.decode(call_prompt_ids(trace, i)) + head
        gap = "" if head.endswith(" ") else " "

        pattern, repl = _probs(model, tok, context, gap, ""), _probs(model, tok, context, gap, f"{gap}{bug.bug} /")
        return {
            "bug": bug.bug,
            "p_pattern": pattern[OPS.index(bug.bug)],
            "p_replacement": repl[OPS.index(bug.op)],
            "argmax_pattern": OPS[max(range(8), key=pattern.__getitem__)] == bug.bug,
            "argmax_replacement": OPS[max(range(8), key=repl.__getitem__)] == bug.op,
        }
    return None


KEYS = ["p_pattern", "p_replacement", "argmax_pattern", "argmax_replacement"]


def measure(model_dir: str, traces: list[dict], bugs: dict) -> dict:
    model, tok = load(model_dir)
    rows = [r for t in traces if (r := probe(t, bugs[t["task_id"]], model, tok)) is not None]
    out = {k: round(sum(r[k] for r in rows) / max(1, len(rows)), 3) for k in KEYS}
    out["p_right_fix"] = round(sum(r["p_pattern"] * r["p_replacement"] for r in rows) / max(1, len(rows)), 3)
    return {"model": model_dir or "warm start", "episodes": len(rows), **out, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a run directory of hrl train --recipe demo (its held-out traces)")
    ap.add_argument("--model", nargs="*", default=[""], help="model dirs or LoRA checkpoints ('' = the warm start)")
    ap.add_argument("--step", type=int, default=0, help="which evaluation's prompts to replay (default 0)")
    ap.add_argument("--tasks", type=Path, default=ROOT / "recipes" / "demo" / "heldout.jsonl")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    bugs = {t.instance_id: task_bug(t) for t in load_tasks(a.tasks)}
    path = a.run / "eval" / f"step-{a.step:04d}.jsonl"
    if not path.exists():
        sys.exit(f"{path}: no such evaluation")
    traces = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    results = [measure(m, traces, bugs) for m in a.model]
    if a.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{'model':<44} {'eps':>4} " + " ".join(f"{k:>18}" for k in [*KEYS, "p_right_fix"]))
    for r in results:
        print(
            f"{r['model'][-44:]:<44} {r['episodes']:>4} " + " ".join(f"{r[k]:>18.3f}" for k in [*KEYS, "p_right_fix"])
        )


if __name__ == "__main__":
    main()
