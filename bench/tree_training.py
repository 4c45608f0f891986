"""Prefix-shared ("tree") training vs one row per branch: training tokens and trainer step time, on the CPU.

Two batches whose branches share long prefixes, each trained by the same trainer with `trainer.tree` off and on
(one warm-up step first, then the timed step; the same weights and samples):

- thinking: a 30-turn trace under a thinking template. Each call's prompt drops the earlier turns' reasoning, so
  every call is its own branch: turn k's branch is the shared history (system prompt, answers, tool results) plus
  turn k's reasoning and answer.
- group: a GRPO group of 8 traces with one 6k-token prompt and their own responses.

"distinct" counts the batch's distinct prefixes independently of the tree code (a dict trie). "max_dlogp" is the
largest |logp(tree) - logp(per branch)| over every token of the batch, in float32: the tree pass's masks (windowed ones
too) reproduce the model's own attention when it is at float32 rounding, which the float64 figures below bound (at the
default sizes: 8.6e-6 and 8.1e-6 on `hrl models tiny --sliding-window 32`; 1.8e-5 and 7.6e-6 on the full-attention
`hrl models tiny`, whose float32 per-branch logprobs are themselves 4.6e-5 from float64; 3.6e-15 for both in float64).

Both passes of that comparison run through one attention kernel, SDPA's math backend (`--kernel math`, the default),
so the figure measures the tree mask and not two kernels' rounding. Without it (`--kernel default`) torch picks per
call: a per-branch pass with no explicit mask (causal) can get another CPU kernel than the tree pass's explicit 4D mask,
and their float32 rounding differs by more than the masks do (on the windowed tiny model, 1.6e-5 instead of 8.6e-6).
The trainer's steps below run with the model's own kernels either way.

The floor of any comparison is printed beside it (`--no-float64-reference` skips it): "branch_vs_f64" is how far the
per-branch logprobs (float32, or bfloat16 with `--dtype bfloat16`) are from the same weights in float64, "tree_vs_f64"
the same for the tree pass, and "max_dlogp_f64" the tree vs per-branch difference in float64 (the masks' own error,
at float64 rounding). The tree is exact enough where tree_vs_f64 is within branch_vs_f64: it is then no further from
the exact logprobs than the per-branch pass it replaces.

    python bench/tree_training.py [--mode lora|full] [--hidden 128 --layers 4] [--group-prompt 6000]
    python bench/tree_training.py --model DIR      # any local model, e.g. `hrl models tiny DIR --sliding-window 32`
    python bench/tree_training.py --model DIR --kernel default   # each pass on the kernel torch picks for it
    python bench/tree_training.py --dtype bfloat16 --kernel default   # bf16 weights, as a GPU trains
"""

from __future__ import annotations

import argparse
import contextlib
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


def kernel(name: str) -> contextlib.AbstractContextManager[Any]:
    """The attention kernel both passes of a comparison run under: SDPA's math backend, or torch's pick per call."""
    if name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def _passes(model: Any, seqs: list[list[int]], kern: str) -> tuple[list[Any], list[Any]]:
    """Per sequence, its logprobs from one tree pass over all of them and from its own forward pass (no grad)."""
    import torch

    with torch.no_grad(), kernel(kern):
        tree = tree_logprobs(model, seqs)
        alone = [token_logprobs(model, torch.tensor([s]), torch.ones((1, len(s)), dtype=torch.long))[0] for s in seqs]
    return tree, alone


def _max_diff(xs: list[Any], ys: list[Any]) -> float:
    return max(
        (float((x.double() - y.double()).abs().max()) for x, y in zip(xs, ys, strict=True) if len(y)), default=0.0
    )


def max_dlogp(model: Any, samples: list[Sample], kern: str = "math", reference: Any = None) -> dict[str, float]:
    """max |logp(tree pass) - logp(one forward per branch)| over every predicted token of the batch; with a float64
    `reference` model, also the float32 passes' distance from its per-branch logprobs and its own tree difference."""
    seqs = [s.input_ids for s in samples]
    tree, alone = _passes(model, seqs, kern)
    out = {"max_dlogp": _max_diff(tree, alone)}
    if reference is not None:
        tree64, alone64 = _passes(reference, seqs, kern)
        out["branch_vs_f64"] = _max_diff(alone, alone64)
        out["tree_vs_f64"] = _max_diff(tree, alone64)
        out["max_dlogp_f64"] = _max_diff(tree64, alone64)
    return out


def measure(
    a: argparse.Namespace, model: str, name: str, samples: list[Sample], lm: Any, reference: Any
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "case": name,
        "branches": len(samples),
        "per_branch_tokens": sum(len(s.input_ids) for s in samples),
        "distinct_tokens": distinct(samples),
        "tree_tokens": len(build_tree([s.input_ids for s in samples])),
        **max_dlogp(lm, samples, a.kernel, reference),
    }
    if not a.steps:
        return row
    for tree in ("off", "on"):
        cfg = TrainerConfig(model=model, mode=a.mode, lr=1e-4, micro_batch=a.micro_batch, tree=tree, dtype=a.dtype)
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
    p.add_argument(
        "--kernel",
        choices=["math", "default"],
        default="math",
        help="attention kernel of both Δlogp passes: SDPA's math backend (like with like), or torch's pick per call",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="the weights' dtype of the Δlogp passes (bfloat16: as a GPU trains; the float64 reference is built from "
        "these very weights)",
    )
    p.add_argument(
        "--steps",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time a trainer step with the tree off and on (--no-steps: the Δlogp figures only)",
    )
    p.add_argument(
        "--float64-reference",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also load the model in float64 and print how far the float32 passes are from it (the floor)",
    )
    a = p.parse_args()
    rng = random.Random(a.seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model or _model(a, tmp)
        a.vocab = _vocab(model) if a.model else a.vocab
        lm = _load(model, a.dtype)
        if reason := tree_declined(lm):
            sys.exit(f"tree passes cannot reproduce {model}'s attention: {reason}")
        reference = lm_f64(lm) if a.float64_reference else None
        for name, batch in ((f"thinking-{a.turns}", thinking_trace(a, rng)), (f"grpo-{a.group}", grpo_group(a, rng))):
            rows.append(measure(a, model, name, batch, lm, reference))
    cols = ["case", "branches", "per_branch_tokens", "tree_tokens", "distinct_tokens"]
    cols += ["tree_token_ratio"] if a.steps else []
    cols += ["max_dlogp"] + (["branch_vs_f64", "tree_vs_f64", "max_dlogp_f64"] if a.float64_reference else [])
    cols += ["step_s_off", "step_s_on", "time_ratio"] if a.steps else []
    print(" | ".join(cols), file=sys.stderr)
    for r in rows:
        print(" | ".join(_cell(c, r[c]) for c in cols), file=sys.stderr)
    worst = max(r["max_dlogp"] for r in rows)
    print(f"attention: {_attention(lm)}; Δlogp passes on {_kernel_words(lm, a.kernel)}", file=sys.stderr)
    print(f"max |Δlogp| tree vs per-branch, {a.dtype}: {worst:.3g}", file=sys.stderr)
    if a.float64_reference:
        floor, tree = max(r["branch_vs_f64"] for r in rows), max(r["tree_vs_f64"] for r in rows)
        print(
            f"floor: {a.dtype} per-branch vs float64 per-branch {floor:.3g}, {a.dtype} tree vs float64 per-branch "
            f"{tree:.3g} ({'within' if tree <= floor else 'OUTSIDE'} the per-branch pass's own error); tree vs "
            f"per-branch in float64 {max(r['max_dlogp_f64'] for r in rows):.3g}",
            file=sys.stderr,
        )
    json.dump({"config": vars(a), "attention": _attention(lm), "results": rows}, sys.stdout, indent=2)
    print()


def _cell(col: str, value: Any) -> str:
    return f"{value:.3g}" if "dlogp" in col or "f64" in col else str(value)


def lm_f64(lm: Any) -> Any:
    """The model in float64 from `lm`'s own weights (a bf16 model's rounded weights, not the checkpoint's)."""
    import copy

    import torch

    return copy.deepcopy(lm).to(torch.float64)


def _load(model: str, dtype: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).eval()


def _attention(lm: Any) -> str:
    """The model's attention in words: its implementation, and the window of its windowed layers."""
    layers = ", ".join(k if w is None else f"{k} window {w}" for k, w in attention_layout(lm)[0].items())
    return f"{attention_implementation(lm)}; {layers}"


def _kernel_words(lm: Any, kern: str) -> str:
    """Which kernel the two Δlogp passes ran on, in words."""
    if attention_implementation(lm) != "sdpa":
        return f"{attention_implementation(lm)} attention (no SDPA kernel to choose), both passes"
    if kern == "math":
        return "SDPA's math backend, both passes (like with like)"
    return "torch's own SDPA kernel per call, each pass"


if __name__ == "__main__":
    main()
