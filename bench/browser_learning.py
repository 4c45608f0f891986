"""Does a tiny browser agent learn on the CPU? The browser recipe's own agent on MiniWoB++ click-button pages,
warm-started, then trained by `hrl train`, with held-out success before and after.

  python bench/browser_learning.py --out bench/results/browser_learning.json
  python bench/browser_learning.py --tiny                 # the pipeline end to end in a few minutes, no figure

click-button: "Click on the "X" button." above two to six buttons; the agent must answer `click X`, copying the label
out of the page's accessibility snapshot. A right click is the page's reward 1, a wrong button -1, nothing 0.

1. Pages (the package's click-button, one seed each): the warm start's from seed 10000 on, the training tasks'
   seeds 0 … 199, the held-out tasks' 1000 … 1047. No page is in two sets.
2. Warm start: each warm-start page's first prompt exactly as the recipe's agent sends it (its system prompt and
   `observation(snapshot)`, the snapshot taken the same way, rendered by the proxy's own prompt planning), and the
   reply `click LABEL`: the right label with probability `--right`, else another button of the page, so that the
   start succeeds sometimes and RL has something to improve. A byte-level BPE on those texts, a random Qwen2
   (`hrl.train.tiny`), SFT on the reply tokens.
3. RL: `hrl train --recipe browser --model WARM -c tasks=train.jsonl -c eval_tasks=heldout.jsonl`, the product's own
   loop, which evaluates every held-out page before the first update and after the last (`eval/success`).

Every figure is from the run's metrics.jsonl; `--out FILE` keeps them as JSON. What it measured
(`bench/results/browser_learning-*.json`): the warm start does not learn to read the label (its SFT loss stays at
0.91-0.93), so RL has nothing to amplify; docs/browser.md, "Learning on the CPU".
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = "click-button"
WARM_SEED0, TRAIN_SEED0, HELD_SEED0 = 10_000, 0, 1_000
ASKED = re.compile(r'Click on the \\?"([^"\\]+)\\?" button')  # quoted as YAML escapes it where the text has a colon
BUTTON = re.compile(r'- button "([^"]+)"')


def recipe_agent() -> Any:
    """The browser recipe's agent module (its SYSTEM prompt and `observation`), loaded from its file."""
    spec = importlib.util.spec_from_file_location("browser_recipe_agent", ROOT / "recipes" / "browser" / "agent.py")
    if spec is None or spec.loader is None:
        raise SystemExit("recipes/browser/agent.py cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tasks(seed0: int, n: int) -> list[Any]:
    from hrl.runners.tasks.miniwob import load_miniwob

    base = load_miniwob(f"miniwob:{PAGE}")[0]
    return [base.model_copy(update={"instance_id": f"miniwob.{PAGE}.s{s}", "seed": s}) for s in range(seed0, seed0 + n)]


async def on_pages(pages: list[Any], visit: Any, parallel: int = 2) -> list[Any]:
    """`await visit(i, page)` for each MiniWoB++ page, `parallel` at a time, as the recipe's agent meets it: started
    by the miniwob verifier's own `start_page`, reached with Playwright over CDP; the results in page order."""
    from playwright.async_api import async_playwright

    from hrl.runners.tasks.miniwob import start_page

    out: list[Any] = [None] * len(pages)
    gate = asyncio.Semaphore(parallel)
    async with async_playwright() as pw:

        async def one(i: int, task: Any) -> None:
            async with gate:
                episode = await start_page(task, 600.0)
                try:
                    browser = await pw.chromium.connect_over_cdp(episode.browser.cdp_url)
                    try:
                        page = next(p for c in browser.contexts for p in c.pages if p.url == episode.page_url)
                        out[i] = await visit(i, page)
                    finally:
                        await browser.close()
                finally:
                    await episode.stack.aclose()

        await asyncio.gather(*(one(i, t) for i, t in enumerate(pages)))
    return out


async def snapshots(pages: list[Any], parallel: int = 2) -> list[tuple[str, str, list[str]]]:
    """(snapshot, the asked label, the page's button labels) of each page's first turn, as the recipe's agent sees
    it: Playwright's `aria_snapshot` of the page's body."""

    async def visit(_: int, page: Any) -> tuple[str, str, list[str]]:
        snap = await page.locator("body").aria_snapshot(timeout=5000)
        asked = ASKED.search(snap)
        return snap, asked.group(1) if asked else "", BUTTON.findall(snap)

    return [o for o in await on_pages(pages, visit, parallel) if o is not None and o[1]]


def build_warm_start(examples: list[tuple[str, str, list[str]]], out: Path, seed: int, right: float, steps: int,
                     say: Any) -> dict[str, Any]:  # fmt: skip
    """Tokenizer, random Qwen2 and SFT on `click LABEL` replies to the recipe's first prompt; saved into `out`."""
    import torch

    from hrl.runners.proxy.dialects.chat import ChatDialect
    from hrl.runners.proxy.session import Session
    from hrl.runners.proxy.template import ChatTemplate
    from hrl.train.tiny.agent import TinyAgentConfig, random_qwen2, sft
    from hrl.train.tiny.model import train_chatml_tokenizer

    agent, rng, t0 = recipe_agent(), random.Random(seed), time.monotonic()
    rows = []
    for snap, asked, buttons in examples:
        others = [b for b in buttons if b != asked]
        label = asked if rng.random() < right or not others else rng.choice(others)
        rows.append(([{"role": "system", "content": agent.SYSTEM}, {"role": "user", "content": agent.observation(snap)}],
                     f"click {label}", label == asked))  # fmt: skip
    corpus = [agent.SYSTEM] + [m[1]["content"] for m, _, _ in rows] + [r for _, r, _ in rows]
    tokenizer = train_chatml_tokenizer(corpus, 1024)
    cfg = TinyAgentConfig(seed=seed, vocab_size=1024, max_position_embeddings=2048, bare_steps=0, brief_steps=0,
                          steps=steps, batch_size=16, lr=3e-3)  # fmt: skip
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    model = random_qwen2(cfg, tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    template, data = ChatTemplate(str(out)), []
    for messages, reply, _ in rows:  # the prompt as the proxy plans it at rollout time, then the sampled reply
        plan = Session("warm").plan(ChatDialect().parse({"model": "m", "messages": messages}, None), template)
        response = template.encode(reply + "<|im_end|>")
        data.append((plan.prompt_ids + response, [0] * len(plan.prompt_ids) + [1] * len(response)))

    def progress(kind: str, info: dict[str, Any]) -> None:
        if kind == "step" and (info["step"] % 50 == 0 or info["step"] == info["steps"]):
            say(f"  warm start: step {info['step']}/{info['steps']}, loss {info['loss']:.3f}")

    loss = sft(model, [(lambda: data, steps, cfg.batch_size)], cfg, progress)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    return {"examples": len(rows), "right_share": round(sum(ok for *_, ok in rows) / len(rows), 3),
            "mean_prompt_tokens": round(sum(len(d[0]) for d in data) / len(data), 1), "final_loss": round(loss, 4),
            "params": sum(p.numel() for p in model.parameters()), "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip


def train(model: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """`hrl train --recipe browser` from the warm start; the run's eval rows and per-step rewards."""
    from hrl.runners.tasks.task import write_tasks

    write_tasks(tasks(TRAIN_SEED0, args.train_tasks), work / "train.jsonl")
    write_tasks(tasks(HELD_SEED0, args.heldout), work / "heldout.jsonl")
    run = work / "run"
    argv = [sys.executable, "-m", "hrl.cli", "train", "--recipe", "browser", "--model", str(model), "--sandbox",
            "local", "--run-dir", str(run), "--include-unchecked", "-c", f"tasks={work / 'train.jsonl'}",
            "-c", f"eval_tasks={work / 'heldout.jsonl'}", "-c", f"train.iterations={args.iterations}",
            "-c", f"train.group_size={args.group_size}", "-c", f"train.tasks_per_iteration={args.tasks_per_iteration}",
            "-c", f"train.concurrency={args.concurrency}", "-c", "train.eval_every=0",
            "-c", "trainer.mode=lora", "-c", "trainer.lora_rank=16", "-c", "trainer.lora_alpha=32",
            "-c", f"trainer.lr={args.lr}", "-c", "trainer.max_grad_norm=1.0", "-c", "proxy.default_max_tokens=16",
            "-c", "rollout.time_budget_s=60"]  # fmt: skip
    t0 = time.monotonic()
    done = subprocess.run(argv, cwd=work, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"hrl train failed ({done.returncode}):\n{done.stderr[-4000:]}")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [{k: r[k] for k in ("step", "eval/success", "eval/reward", "eval/episodes", "eval/failed") if k in r}
             for r in rows if "eval/success" in r]  # fmt: skip
    steps = [{"step": r["step"], "reward": r.get("trace/reward"), "success": r.get("trace/success"),
              "zero_variance_frac": r.get("adv/zero_variance_frac")}
             for r in rows if "eval/success" not in r and "step" in r]  # fmt: skip
    return {"evals": evals, "steps": steps, "seconds": round(time.monotonic() - t0, 1), "argv": argv[3:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warm-pages", type=int, default=320, help="pages of the warm start (one transcript each)")
    ap.add_argument("--right", type=float, default=0.5, help="share of warm-start replies with the right label")
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--train-tasks", type=int, default=200)
    ap.add_argument("--heldout", type=int, default=48)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--tasks-per-iteration", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3, help="LoRA (rank 16), as the demo recipe")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a few pages and steps: the pipeline end to end, no figure")
    ap.add_argument("--work", type=Path, default=None, help="keep the models, tasks and run here")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.tiny:
        args.warm_pages, args.sft_steps, args.train_tasks, args.heldout, args.iterations = 8, 4, 4, 2, 1
        args.group_size, args.tasks_per_iteration = 2, 1
    work = args.work or Path(tempfile.mkdtemp(prefix="hrl-browser-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)

    kept = work / "snapshots.json"  # a --work folder keeps them: a second run with other settings starts from them
    saved = json.loads(kept.read_text()) if kept.is_file() else {"pages": 0, "examples": []}
    if saved["pages"] != args.warm_pages:
        say(f"taking the first snapshot of {args.warm_pages} warm-start pages")
        saved = {"pages": args.warm_pages, "examples": asyncio.run(snapshots(tasks(WARM_SEED0, args.warm_pages)))}
        kept.write_text(json.dumps(saved))
    examples = [tuple(e) for e in saved["examples"]]
    say(f"{len(examples)} snapshots; building the warm start ({args.sft_steps} SFT steps)")
    warm = build_warm_start(examples, work / "warm", args.seed, args.right, args.sft_steps, say)
    say(f"warm start: {warm}")
    say(f"hrl train: {args.iterations} iterations × {args.tasks_per_iteration} tasks × {args.group_size} episodes")
    trained = train(work / "warm", work, args)
    for row in trained["evals"]:
        say(f"held-out at step {row['step']}: success {row['eval/success']:.3f} over {row['eval/episodes']} episodes")
    result = {"page": PAGE, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "warm_start": warm, "train": trained, "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
