"""Prefix-shared ("tree") training vs one row per branch: training tokens and trainer step time, on the CPU.

Two batches whose branches share long prefixes, each trained by the same trainer with `trainer.tree` off and on
(one warm-up step first, then the timed step; the same weights and samples):

- thinking: a 30-turn trace under a thinking template. Each call's prompt drops the earlier turns' reasoning, so
  every call is its own branch: turn k's branch is the shared history (system prompt, answers, tool results) plus
  turn k's reasoning and answer.
- group: a GRPO group of 8 traces with one 6k-token prompt and their own responses.

"distinct" counts the batch's distinct prefixes independently of the tree code (a dict trie). "max_dlogp" is the
largest |logp(tree) - logp(per branch)| over every token of the batch, in float32: the tree pass's masks (windowed ones
too) reproduce the model's own attention when it is at float32 rounding (< 1e-5).

    python bench/tree_training.py [--mode lora|full] [--hidden 128 --layers 4] [--group-prompt 6000]
    python bench/tree_training.py --model DIR      # any local model, e.g. `hrl models tiny DIR --sliding-window 32`
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from typing import Any

from hrl.train.logprobs import token_logprobs
from hrl.train.samples import Sample
from hrl.train.trainer import Trainer, TrainerConfig
from hrl.train.tree import attention_implementation, attention_layout, build_tree, tree_declined, tree_logprobs


def _sample(trace: str, group: str, ids: list[int], loss: list[int], rng: random.Random) -> Sample:
    return Sample(
        trace_id=trace,
        group_id=group,
        branch=["c"],
        input_ids=ids,
        loss_mask=loss,
        behaviour_logprobs=[-rng.uniform(2, 6) * m for m in loss],
        versions=[m - 1 for m in loss],
        weight=[m / max(1, sum(loss)) for m in loss],
        advantage=rng.uniform(-1, 1),
    )


def thinking_trace(a: argparse.Namespace, rng: random.Random) -> list[Sample]:
    """One trace, one branch per turn: history (answers and tool results, no reasoning) + this turn's reasoning."""
    tok = lambda n: [rng.randrange(a.vocab) for _ in range(n)]  # noqa: E731
    history, history_loss, out = tok(a.system), [0] * a.system, []
    for k in range(a.turns):
        think, answer, tool = tok(a.think), tok(a.answer), tok(a.tool)
        ids = history + think + answer
        out.append(_sample("trace", "trace", ids, history_loss + [1] * (a.think + a.answer), rng))
        history = history + answer + tool  # the next prompt keeps the answer, drops the reasoning
        history_loss = history_loss + [0] * (a.answer + a.tool)  # a prompt that is not an exact extension is text
        del k
    for s in out:
        s.advantage = out[0].advantage  # one trace, one advantage
    return out


def grpo_group(a: argparse.Namespace, rng: random.Random) -> list[Sample]:
    prompt = [rng.randrange(a.vocab) for _ in range(a.group_prompt)]
    out = []
    for i in range(a.group):
        n = rng.randint(a.response // 2, a.response)
        ids = prompt + [rng.randrange(a.vocab) for _ in range(n)]
        out.append(_sample(f"t{i}", "g", ids, [0] * len(prompt) + [1] * n, rng))
    return out


def distinct(samples: list[Sample]) -> int:
    root: dict[int, Any] = {}
    count = 0
    for s in samples:
        node = root
        for t in s.input_ids:
            if t not in node:
                node[t] = {}
                count += 1
            node = node[t]
    return count


def _model(a: argparse.Namespace, out: str) -> str:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    heads = max(1, a.hidden // 32)
    cfg = Qwen2Config(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=4 * a.hidden,
        num_hidden_layers=a.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=32768,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    return out


def _vocab(model: str) -> int:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model)
    return int(cfg.get_text_config().vocab_size)


def max_dlogp(model: Any, samples: list[Sample]) -> float:
    """max |logp(tree pass) - logp(one forward per branch)| over every predicted token of the batch."""
    import torch

    seqs = [s.input_ids for s in samples]
    with torch.no_grad():
        tree = tree_logprobs(model, seqs)
        alone = [token_logprobs(model, torch.tensor([s]), torch.ones((1, len(s)), dtype=torch.long))[0] for s in seqs]
    return max((float((t - b).abs().max()) for t, b in zip(tree, alone, strict=True) if len(b)), default=0.0)


def measure(a: argparse.Namespace, model: str, name: str, samples: list[Sample], lm: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "case": name,
        "branches": len(samples),
        "per_branch_tokens": sum(len(s.input_ids) for s in samples),
        "distinct_tokens": distinct(samples),
        "tree_tokens": len(build_tree([s.input_ids for s in samples])),
        "max_dlogp": max_dlogp(lm, samples),
    }
    for tree in ("off", "on"):
        cfg = TrainerConfig(model=model, mode=a.mode, lr=1e-4, micro_batch=a.micro_batch, tree=tree)
        trainer = Trainer(cfg)
        trainer.step(samples[:2])  # warm-up
        t0 = time.perf_counter()
        m = trainer.step(samples)
        row[f"step_s_{tree}"] = round(time.perf_counter() - t0, 2)
        row[f"loss_{tree}"] = m["train/loss"]
        row["tree_token_ratio"] = round(m["train/tree_token_ratio"], 4)
    row["time_ratio"] = round(row["step_s_on"] / row["step_s_off"], 3)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a local model directory (any causal LM) instead of a random Qwen2 of this shape")
    p.add_argument("--mode", choices=["lora", "full"], default="lora")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096, help="token ids drawn below this (--model: its vocabulary)")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--system", type=int, default=400, help="thinking case: system + task prompt tokens")
    p.add_argument("--think", type=int, default=120, help="thinking case: reasoning tokens per turn")
    p.add_argument("--answer", type=int, default=40, help="thinking case: answer / tool-call tokens per turn")
    p.add_argument("--tool", type=int, default=80, help="thinking case: tool-result tokens per turn")
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--group-prompt", type=int, default=6000)
    p.add_argument("--response", type=int, default=256, help="group case: longest response (shortest: half)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = random.Random(a.seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model or _model(a, tmp)
        a.vocab = _vocab(model) if a.model else a.vocab
        lm = _float32(model)
        if reason := tree_declined(lm):
            sys.exit(f"tree passes cannot reproduce {model}'s attention: {reason}")
        for name, batch in ((f"thinking-{a.turns}", thinking_trace(a, rng)), (f"grpo-{a.group}", grpo_group(a, rng))):
            rows.append(measure(a, model, name, batch, lm))
    cols = ["case", "branches", "per_branch_tokens", "tree_tokens", "distinct_tokens", "tree_token_ratio"]
    cols += ["max_dlogp", "step_s_off", "step_s_on", "time_ratio"]
    print(" | ".join(cols), file=sys.stderr)
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols), file=sys.stderr)
    worst = max(r["max_dlogp"] for r in rows)
    print(f"max |Δlogp| tree vs per-branch, float32 ({_attention(lm)}): {worst:.3g}", file=sys.stderr)
    json.dump({"config": vars(a), "results": rows}, sys.stdout, indent=2)
    print()


def _float32(model: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()


def _attention(lm: Any) -> str:
    """The model's attention in words: its implementation, and the window of its windowed layers."""
    layers = ", ".join(k if w is None else f"{k} window {w}" for k, w in attention_layout(lm)[0].items())
    return f"{attention_implementation(lm)}; {layers}"


if __name__ == "__main__":
    main()
