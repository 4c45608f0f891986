"""Does a real pretrained model learn through hrl on the CPU? SmolLM2-135M-Instruct as the browser recipe's own
white-box agent on MiniWoB++ click-button pages in local Chromium, graded by the page's reward; held-out success
before the first update and after the last, per seed and pooled, with Wilson 95 % intervals, kept as a card.

  python bench/real_model_learning.py --out bench/results/real-model-browser.json     # 3 seeds
  python bench/real_model_learning.py --tiny --model DIR --out /tmp/card.json        # the pipeline end to end

The pages are bench/browser_learning.py's (imported, not copied): click-button, train seeds 0 … 199, held-out
1000 … 1047, warm-start pages from 10000 on. No page is in two sets; nothing here looks at held-out pages except
`hrl train`'s own evaluation.

1. Warm start (format only; `--sft-steps 0` skips it). Zero-shot, the model never answers in the agent's action
   format at temperature 1 (what `hrl train` samples at): it rambles ("Your action is to click on the "ok" button.
   Another possible way …"), so every group is all-zero and GRPO has no signal. So: full-weight SFT on the recipe's
   exact prompts (rendered as the proxy plans them) of warm-start pages, teaching the *format* and not the answer:
   turn 1 replies `click B` with B a button of the page drawn uniformly (right only by chance, 1/#buttons), turn 2
   (the snapshot after that click) replies `done`. Which button is asked is never taught; RL has to find it.
2. RL: `hrl train --recipe browser --model WARM` per seed (`-c train.seed=S`), the product's loop, LoRA, on the
   training pages; held-out success from the run's metrics.jsonl (`eval/success` at the first and last step).
3. `hrl regrade RUN --json`: grader agreement.

The card (`--out`) holds the model's hashes, the harness's, the recipe's, per seed and pooled held-out before/after
with Wilson intervals, wall times, the engine, the CPU and the command that reproduces it. docs/real-models.md.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import json
import math
import os
import platform
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import browser_learning as bl

ROOT = bl.ROOT
RECIPE = ROOT / "recipes" / "browser" / "recipe.yaml"
AGENT = ROOT / "recipes" / "browser" / "agent.py"


# ---------------------------------------------------------------------------------------------------------- figures
def wilson(k: int, n: int, z: float = 1.959964) -> list[float]:
    """Wilson score 95 % interval of k successes in n."""
    if n <= 0:
        return [0.0, 1.0]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def heldout(before_k: int, after_k: int, n: int) -> dict[str, Any]:
    return {"before": round(before_k / n, 4) if n else None, "after": round(after_k / n, 4) if n else None, "n": n,
            "before_k": before_k, "after_k": after_k, "before_ci": wilson(before_k, n),
            "after_ci": wilson(after_k, n)}  # fmt: skip


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cpu() -> dict[str, Any]:
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"model": name, "cores": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]}


def model_hashes(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    src = path / "hrl-source.json"
    if src.is_file():
        info = json.loads(src.read_text())
        out["gguf_sha256"] = info.get("source", {}).get("gguf_sha256")
        out["source"] = {k: info.get("source", {}).get(k) for k in ("kind", "package", "version", "member")}
    for f in sorted(path.glob("*.safetensors")):
        out[f"{f.name}_sha256"] = sha256_file(f)
    return out


def git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=30)  # fmt: skip
        return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


# ------------------------------------------------------------------------------------------------------- warm start
async def two_turns(pages: list[Any], seed: int, parallel: int = 2) -> list[dict[str, Any]]:
    """Per warm-start page: the first snapshot (as the recipe's agent sees it), a button drawn uniformly among the
    page's, the snapshot after the agent's own `click` of it, and whether that was the asked button."""
    agent, rng = bl.recipe_agent(), random.Random(seed)
    picks = [rng.random() for _ in pages]

    async def visit(i: int, page: Any) -> dict[str, Any] | None:
        first = await page.locator("body").aria_snapshot(timeout=5000)
        asked, buttons = bl.ASKED.search(first), bl.BUTTON.findall(first)
        if not asked or not buttons:
            return None
        label = buttons[min(int(picks[i] * len(buttons)), len(buttons) - 1)]
        await agent._act(page, f"click {label}")
        await asyncio.sleep(0.2)
        second = await page.locator("body").aria_snapshot(timeout=5000)
        return {"first": first, "second": second, "label": label, "right": label == asked.group(1),
                "buttons": len(buttons)}  # fmt: skip

    return [o for o in await bl.on_pages(pages, visit, parallel) if o is not None]


def warm_start(base: Path, work: Path, args: argparse.Namespace, say: Any) -> tuple[Path, dict[str, Any]]:
    """Full-weight SFT of `base` on the agent's format (module doc, 1); saved to work/warm. Kept when the same
    settings built it before (warm.json)."""
    import torch

    from hrl.runners.proxy.dialects.chat import ChatDialect
    from hrl.runners.proxy.session import Session
    from hrl.runners.proxy.template import ChatTemplate
    from hrl.train.tiny.agent import TinyAgentConfig, sft

    out = work / "warm"
    key = {"base": str(base), "base_hash": model_hashes(base), "pages": args.warm_pages, "steps": args.sft_steps,
           "lr": args.sft_lr, "batch": args.sft_batch, "seed": 0, "agent": sha256_file(AGENT)}  # fmt: skip
    info_file = out / "warm.json"
    if info_file.is_file() and json.loads(info_file.read_text()).get("key") == key:
        say(f"warm start: kept ({out})")
        return out, json.loads(info_file.read_text())
    t0 = time.monotonic()
    say(f"warm start: snapshots of {args.warm_pages} pages (seeds {bl.WARM_SEED0}+)")
    rows = asyncio.run(two_turns(bl.tasks(bl.WARM_SEED0, args.warm_pages), seed=0))
    agent = bl.recipe_agent()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    template, data = ChatTemplate(str(base)), []
    for r in rows:
        first = [
            {"role": "system", "content": agent.SYSTEM},
            {"role": "user", "content": agent.observation(r["first"])},
        ]
        second = [*first, {"role": "assistant", "content": f"click {r['label']}"},
                  {"role": "user", "content": agent.observation(r["second"])}]  # fmt: skip
        for messages, reply in ((first, f"click {r['label']}"), (second, "done")):
            plan = Session("warm").plan(ChatDialect().parse({"model": "m", "messages": messages}, None), template)
            response = template.encode(reply + "<|im_end|>")
            data.append((plan.prompt_ids + response, [0] * len(plan.prompt_ids) + [1] * len(response)))
    cfg = TinyAgentConfig(seed=0, bare_steps=0, brief_steps=0, steps=args.sft_steps, batch_size=args.sft_batch,
                          lr=args.sft_lr, warmup_steps=min(5, args.sft_steps))  # fmt: skip
    losses: list[float] = []

    def progress(kind: str, info: dict[str, Any]) -> None:
        if kind == "step":
            losses.append(info["loss"])
            if info["step"] % 5 == 0 or info["step"] == info["steps"]:
                say(f"  warm start: step {info['step']}/{info['steps']}, loss {info['loss']:.3f}")

    model.train()
    loss = sft(model, [(lambda: data, args.sft_steps, args.sft_batch)], cfg, progress) if args.sft_steps else None
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    for f in ("chat_template.jinja", "generation_config.json"):
        if (base / f).is_file() and not (out / f).is_file():
            (out / f).write_bytes((base / f).read_bytes())
    info = {"key": key, "pages": len(rows), "samples": len(data),
            "right_share": round(sum(r["right"] for r in rows) / max(1, len(rows)), 3),
            "chance": round(sum(1 / r["buttons"] for r in rows) / max(1, len(rows)), 3),
            "first_loss": round(losses[0], 4) if losses else None, "final_loss": round(loss, 4) if loss else None,
            "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip
    info["safetensors_sha256"] = model_hashes(out).get("model.safetensors_sha256")
    info_file.write_text(json.dumps(info, indent=1) + "\n")
    say(f"warm start: { ({k: v for k, v in info.items() if k != 'key'}) }")
    return out, info


# ------------------------------------------------------------------------------------------------- second grader
def transcript_grade(run: Path, model: Path) -> dict[str, Any]:
    """A second grader, independent of the page: each episode's recorded tokens decoded, the asked label and the
    buttons read from the first prompt's snapshot, and the first reply `click X` with X a button of the page (in its case,
    else in any case, as the agent matches) decides
    (X the asked label: 1, another button: 0, as click-button scores a first click); no such reply: 0. Agreement
    with the recorded reward (the page's), over every training and held-out episode of the run. (`hrl regrade`
    replays each page's recorded inputs on a fresh page instead; its answer is kept beside this.)"""
    import re

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    agreed, undecided, disagreements, total = 0, 0, [], 0
    for f in sorted((run / "traces").glob("*.jsonl")) + sorted((run / "eval").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            t = json.loads(line)
            if t.get("reward") is None or not t.get("calls"):
                continue
            total += 1
            first = tok.decode(t["calls"][0]["prompt_ids"])
            asked, buttons = bl.ASKED.search(first), bl.BUTTON.findall(first)  # in page order, as the agent finds them
            verdict: float | None = None
            for call in t["calls"]:
                reply = tok.decode(call["response_ids"], skip_special_tokens=True).strip()
                m = re.match(r"click\s+(.+)", reply, re.I)
                label = m.group(1).strip().strip('"') if m else ""
                # the agent's own matching: a button of that name in its case, else in any case
                named = label if label in buttons else next((b for b in buttons if b.lower() == label.lower()), None)
                if m and named is not None:
                    verdict = 1.0 if asked and named == asked.group(1) else 0.0
                    break
            if verdict is None:
                undecided += 1
                verdict = 0.0
            if verdict == float(t["reward"] >= 1.0):
                agreed += 1
            else:
                disagreements.append({"file": f"{f.parent.name}/{f.name}", "trace": t["trace_id"][:8],
                                      "recorded": t["reward"], "transcript": verdict})  # fmt: skip
    return {"episodes": total, "agreed": agreed, "no_decisive_click": undecided,
            "disagreements": len(disagreements), "examples": disagreements[:10]}  # fmt: skip


# ------------------------------------------------------------------------------------------------------------ RL
def train_argv(model: Path, work: Path, run: Path, seed: int, args: argparse.Namespace) -> list[str]:
    return ["train", "--recipe", str(args.recipe), "--model", str(model), "--sandbox", "local", "--run-dir", str(run),
            "--include-unchecked", "-c", f"tasks={work / 'train.jsonl'}", "-c", f"eval_tasks={work / 'heldout.jsonl'}",
            "-c", f"train.seed={seed}", "-c", f"train.iterations={args.iterations}",
            "-c", f"train.group_size={args.group_size}", "-c", f"train.tasks_per_iteration={args.tasks_per_iteration}",
            "-c", f"train.concurrency={args.concurrency}", "-c", "train.eval_every=0",
            "-c", "trainer.mode=lora", "-c", f"trainer.lora_rank={args.lora_rank}",
            "-c", f"trainer.lora_alpha={2 * args.lora_rank}", "-c", f"trainer.lr={args.lr}",
            "-c", "trainer.max_grad_norm=1.0", "-c", "rollout.time_budget_s=60"]  # fmt: skip


@functools.cache
def _card_as_found(card: Path) -> str:
    """The card at `card` as it was before this run wrote it (read once: each seed's card is written over it)."""
    try:
        return card.read_text()
    except OSError:
        return "{}"


def previous(card: Path, seed: int) -> dict[str, Any]:
    """What the card at `card` said of seed `seed` (--card-only keeps its wall time: nothing is run again)."""
    try:
        return next(s for s in json.loads(_card_as_found(card))["per_seed"] if s["seed"] == seed)  # type: ignore[no-any-return]
    except (ValueError, KeyError, StopIteration):
        return {}


def run_seed(model: Path, work: Path, seed: int, args: argparse.Namespace, say: Any) -> dict[str, Any]:
    run = work / f"seed{seed}"
    argv = train_argv(model, work, run, seed, args)
    if args.card_only:  # the runs as they are: the card (and its graders) written again from them
        argv = ["card-only"]
    elif (run / "state.json").is_file():  # a run this work folder began (and lost, e.g. to a kill): continued
        argv = ["train", "--run-dir", str(run), "--resume"]
        say(f"  seed {seed}: continuing {run} (hrl train --resume)")
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = (work / f"seed{seed}.log").open("a")
    done = subprocess.run([sys.executable, "-m", "hrl.cli", *argv], cwd=work, stdout=log, stderr=subprocess.STDOUT,
                          env=env) if not args.card_only else subprocess.CompletedProcess(argv, 0)  # fmt: skip
    log.close()
    wall = round(time.monotonic() - t0, 1)
    if args.card_only:
        wall = previous(args.out, seed).get("wall_s")
    if done.returncode != 0:
        raise SystemExit(f"hrl train failed ({done.returncode}); see {work / f'seed{seed}.log'}")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if "eval/success" in r]
    first, last = evals[0], evals[-1]
    n = int(first.get("eval/episodes", args.heldout))
    if int(last.get("eval/episodes", n)) != n:
        say(f"  seed {seed}: held-out episodes differ before/after ({n} vs {last.get('eval/episodes')})")
    k0, k1 = round(first["eval/success"] * n), round(last["eval/success"] * int(last.get("eval/episodes", n)))
    steps = [{"step": r["step"], "success": r.get("trace/success"), "reward": r.get("trace/reward"),
              "zero_variance_frac": r.get("adv/zero_variance_frac")}
             for r in rows if "eval/success" not in r and "step" in r]  # fmt: skip
    t1 = time.monotonic()
    regrade = subprocess.run([sys.executable, "-m", "hrl.cli", "regrade", str(run), "--json", "--concurrency", "4"],
                             cwd=work, capture_output=True, text=True, env=env)  # fmt: skip
    try:
        graded = json.loads(regrade.stdout)
        agreement = {k: v for k, v in graded.items() if not isinstance(v, list)} | {"rc": regrade.returncode}
        for key in ("disagreements", "regrade_errors", "grading_failed", "not_graded", "not_regradable"):
            agreement[key] = len(graded.get(key) or [])
        agreement["examples"] = (graded.get("disagreements") or [])[:3] + (graded.get("regrade_errors") or [])[:3]
    except json.JSONDecodeError:
        agreement = {"error": f"rc {regrade.returncode}: {(regrade.stderr or regrade.stdout)[-600:]}"}
    agreement["seconds"] = round(time.monotonic() - t1, 1)
    agreement = {"transcript": transcript_grade(run, model), "hrl_regrade": agreement}
    result = {"seed": seed, "heldout": heldout(k0, k1, n), "wall_s": wall, "resumed": previous(args.out, seed).get("resumed") if args.card_only else argv[-1] == "--resume",
              "train_steps": steps,
              "grader_agreement": agreement, "run_dir": str(run)}  # fmt: skip
    say(
        f"seed {seed}: held-out {k0}/{n} -> {k1}/{n} in {wall or 0:.0f} s; transcript grader agrees on "
        f"{agreement['transcript']['agreed']}/{agreement['transcript']['episodes']}"
    )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="hrl:smollm2-135m", help="hrl:NAME, HF id or model dir")
    ap.add_argument("--recipe", default="browser", help="recipe name or recipe.yaml path (the agent: the browser's)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--tasks-per-iteration", type=int, default=3)
    ap.add_argument("--group-size", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--train-tasks", type=int, default=200)
    ap.add_argument("--heldout", type=int, default=48)
    ap.add_argument("--lr", type=float, default=3e-4, help="LoRA (rank 16) learning rate (1e-3, the demo's, hurt)")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--warm-pages", type=int, default=64, help="warm-start pages (two SFT samples each)")
    ap.add_argument("--sft-steps", type=int, default=30, help="0: no warm start, RL from the model as it is")
    ap.add_argument("--sft-lr", type=float, default=2e-5)
    ap.add_argument("--sft-batch", type=int, default=8)
    ap.add_argument("--tiny", action="store_true", help="1 iteration, 2 tasks, 4 held-out: the pipeline end to end")
    ap.add_argument("--work", type=Path, default=None, help="keep the warm start, tasks and runs here")
    ap.add_argument("--card-only", action="store_true", help="train nothing: the card again from --work's runs")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "real-model-browser.json")
    args = ap.parse_args()
    command = "PYTHONPATH=. python " + shlex.join([os.path.relpath(__file__, ROOT), *sys.argv[1:]])
    if args.tiny:
        args.iterations, args.tasks_per_iteration, args.group_size, args.heldout = 1, 2, 2, 4
        args.train_tasks, args.warm_pages, args.sft_steps, args.sft_batch = 4, 4, min(args.sft_steps, 2), 4
    work = (args.work or Path("/tmp") / f"hrl-real-model-{os.getpid()}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {text}", flush=True)

    from hrl.cli.config import materialize_model
    from hrl.runners.models import resolve_model
    from hrl.runners.tasks.task import write_tasks

    base = Path(resolve_model(materialize_model(args.model)))
    say(f"model {args.model}: {base}")
    write_tasks(bl.tasks(bl.TRAIN_SEED0, args.train_tasks), work / "train.jsonl")
    write_tasks(bl.tasks(bl.HELD_SEED0, args.heldout), work / "heldout.jsonl")
    warm, warm_info = warm_start(base, work, args, say) if args.sft_steps else (base, None)
    recipe_file = (
        Path(args.recipe) if args.recipe.endswith((".yaml", ".yml")) else ROOT / "recipes" / args.recipe / "recipe.yaml"
    )
    import torch

    load_at_start = cpu()["loadavg"]

    def write_card(seeds: list[dict[str, Any]]) -> None:
        """The card with the seeds run so far (`complete` once every seed ran): kept after each seed."""
        b = sum(s["heldout"]["before_k"] for s in seeds)
        a = sum(s["heldout"]["after_k"] for s in seeds)
        n = sum(s["heldout"]["n"] for s in seeds)
        agreements = [s["grader_agreement"] for s in seeds]
        card = {
            "schema": "hrl.real-model-card/1",
            "model": args.model, "model_path": str(base), "model_sha256": model_hashes(base),
            "warm_start": None if warm_info is None else {k: v for k, v in warm_info.items() if k != "key"} | {
                "method": "full-weight SFT on the recipe's prompts of warm-start pages (seeds 10000+): turn 1 `click B`, "
                          "B a uniformly drawn button of the page (right only by chance), turn 2 `done`",
                "pages": args.warm_pages, "steps": args.sft_steps, "lr": args.sft_lr, "batch": args.sft_batch},
            "harness": "recipes/browser/agent.py:run (the browser recipe's white-box agent; Playwright over CDP, "
                       "MiniWoB++ click-button in local Chromium, the page's own reward)",
            "harness_version": {"agent_sha256": sha256_file(AGENT), "hrl_commit": git_commit()},
            "recipe": str(recipe_file.relative_to(ROOT)) if recipe_file.is_relative_to(ROOT) else str(recipe_file),
            "recipe_sha256": sha256_file(recipe_file),
            "page": bl.PAGE, "train_seeds": [bl.TRAIN_SEED0, bl.TRAIN_SEED0 + args.train_tasks - 1],
            "heldout_seeds": [bl.HELD_SEED0, bl.HELD_SEED0 + args.heldout - 1],
            "settings": {k: v for k, v in vars(args).items() if k not in ("work", "out")},
            "train_argv": ["hrl", *train_argv(warm, work, work / "seedS", 0, args)],  # seed 0's; seed S: train.seed=S
            "seeds": [s["seed"] for s in seeds],
            "complete": len(seeds) == len(args.seeds),
            "per_seed": seeds,
            "heldout": heldout(b, a, n),
            "wall_s": round(sum(s["wall_s"] or 0 for s in seeds) + (warm_info or {}).get("seconds", 0), 1)
            if args.card_only else round(time.monotonic() - t0, 1),
            "engine": {"name": "embedded", "device": "cpu", "torch": torch.__version__, "threads": torch.get_num_threads()},
            "cpu": cpu() | {"loadavg_at_start": load_at_start},
            "grader_agreement": {
                "method": "transcript regrade (transcript_grade): the first `click BUTTON` reply vs the page's reward",
                "episodes": sum(g["transcript"]["episodes"] for g in agreements),
                "agreed": sum(g["transcript"]["agreed"] for g in agreements),
                "disagreements": sum(g["transcript"]["disagreements"] for g in agreements),
                "hrl_regrade": [g["hrl_regrade"] for g in agreements],
                "hrl_regrade_total": {key: sum(g["hrl_regrade"].get(key, 0) for g in agreements) for key in
                                      ("episodes", "regraded", "agreed", "disagreements", "regrade_errors")},
                "per_seed": [g["transcript"] for g in agreements]},
            "command": json.loads(_card_as_found(args.out)).get("command", command) if args.card_only else command,
            "tiny": args.tiny,
        }  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(card, indent=1) + "\n")
        say(f"pooled held-out {b}/{n} -> {a}/{n} over seeds {[s['seed'] for s in seeds]}; wrote {args.out}")

    seeds: list[dict[str, Any]] = []
    for seed in args.seeds:
        say(f"seed {seed}: hrl train, {args.iterations} iterations x {args.tasks_per_iteration} tasks x "
            f"{args.group_size} episodes, {args.heldout} held-out pages before and after")  # fmt: skip
        seeds.append(run_seed(warm, work, seed, args, say))
        write_card(seeds)


if __name__ == "__main__":
    main()
