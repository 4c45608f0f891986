"""Embedded engine speed: the time to first token of a call that arrives mid-decode behind a long generation,
static against continuous batching (one run, both modes: `EmbeddedEngineConfig.continuous`); prefill and decode
tokens/s at batch 1 and 16; and the memory-bandwidth bound of decode (weight bytes / measured copy bandwidth).

    python bench/embedded_speed.py [--model DIR|hrl:smollm2-135m] [--engine embedded|vllm] [--json FILE]
    python bench/embedded_speed.py --tiny --json out.json   # a tiny model built on the fly: seconds, for CI

Prompts are random token ids (a fixed seed), every request greedy with ignore_eos, so each generates exactly its
max_tokens. TTFT scenario: A (--prompt tokens, generating --long-tokens) starts; B (--short-prompt tokens,
generating --short-tokens) is sent --arrive-s seconds later (and not before A's first token); B's TTFT is from its
send to its first token, with A's streamed token count at that moment. Throughput: --batches requests sent at once
(the embedded engine paused while they queue, so they form one batch): prefill tokens/s = prompt tokens of all rows /
time to the last row's first token; decode tokens/s = the rows' later tokens / the time from there to the end.
`--engine vllm` measures hrl's VLLMEngine ($HRL_VLLM_PYTHON) the same way; it has no static mode (one TTFT row).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hrl.runners.engines import SamplingParams, make_engine

DEFAULT_MODEL = str(Path(os.environ.get("HRL_CACHE") or "~/.cache/hrl").expanduser() / "models" / "smollm2-135m")
TINY = {"prompt": 64, "long_tokens": 96, "short_prompt": 16, "short_tokens": 8, "arrive_s": 0.0,
        "decode_tokens": 16, "batches": [1, 4], "bandwidth_mib": 64}  # fmt: skip


def machine() -> dict[str, Any]:
    import torch
    import transformers

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "load": os.getloadavg(),
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}  # fmt: skip


def copy_bandwidth(mib: int, repeat: int = 3) -> float:
    """Bytes/s of a large tensor copy, best of `repeat`, counting the bytes read and the bytes written."""
    import torch

    src = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best


def weight_bytes(engine: Any, model_dir: str) -> int:
    """The bytes of weights one decode step reads: the loaded parameters (tied ones once), or the checkpoint files'
    size for an engine in another process."""
    model = getattr(engine, "model", None)
    if model is not None:
        return sum(p.numel() * p.element_size() for p in model.parameters())
    return sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))


def prompt_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(10, vocab) for _ in range(n)]


async def started(a: argparse.Namespace, model: str, continuous: bool) -> Any:
    if a.engine == "vllm":
        engine = make_engine("vllm", model, max_model_len=a.prompt + a.long_tokens + 64)
    else:
        engine = make_engine("embedded", model, continuous=continuous, threads=a.threads,
                             max_batch_size=max(a.batches))  # fmt: skip
    await engine.start()
    greedy = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    async for _ in engine.generate("warmup", list(range(10, 42)), greedy):  # first forward: allocations, kernels
        pass
    return engine


async def ttft(engine: Any, a: argparse.Namespace, vocab: int) -> dict[str, Any]:
    """B's time to first token when it arrives while A decodes."""
    rng = random.Random(1)
    p_a, p_b = prompt_ids(rng, a.prompt, vocab), prompt_ids(rng, a.short_prompt, vocab)
    count = {"a": 0}
    a_first = asyncio.Event()

    async def run_a() -> float:
        t0 = time.perf_counter()
        async for d in engine.generate("long", p_a, SamplingParams(max_tokens=a.long_tokens, temperature=0.0,
                                                                   ignore_eos=True)):  # fmt: skip
            count["a"] += len(d.token_ids)
            a_first.set()
        return time.perf_counter() - t0

    t_a = time.perf_counter()
    task = asyncio.create_task(run_a())
    await a_first.wait()
    await asyncio.sleep(max(0.0, a.arrive_s - (time.perf_counter() - t_a)))
    arrived_s, a_at_arrival = time.perf_counter() - t_a, count["a"]
    t_b, first, a_at_first = time.perf_counter(), None, None
    async for d in engine.generate("short", p_b, SamplingParams(max_tokens=a.short_tokens, temperature=0.0,
                                                                ignore_eos=True)):  # fmt: skip
        if first is None and d.token_ids:
            first, a_at_first = time.perf_counter() - t_b, count["a"]
    b_total = time.perf_counter() - t_b
    a_total = await task
    return {"b_ttft_s": round(first or 0.0, 3), "b_total_s": round(b_total, 3), "b_arrived_s": round(arrived_s, 3),
            "a_tokens_at_b_arrival": a_at_arrival, "a_tokens_at_b_first_token": a_at_first,
            "a_tokens": count["a"], "a_total_s": round(a_total, 3)}  # fmt: skip


async def throughput(engine: Any, a: argparse.Namespace, batch: int, vocab: int) -> dict[str, Any]:
    rng = random.Random(2 + batch)
    prompts = [prompt_ids(rng, a.prompt, vocab) for _ in range(batch)]
    params = SamplingParams(max_tokens=a.decode_tokens, temperature=0.0, ignore_eos=True)
    firsts: list[float] = []
    ends: list[float] = []

    async def one(i: int) -> int:
        n = 0
        async for d in engine.generate(f"t{batch}-{i}", prompts[i], params):
            if n == 0 and d.token_ids:
                firsts.append(time.perf_counter())
            n += len(d.token_ids)
        ends.append(time.perf_counter())
        return n

    embedded = hasattr(engine, "_pending")
    if embedded:  # queue them all, then let them go as one batch (one batched prefill)
        await engine.pause()
    tasks = [asyncio.create_task(one(i)) for i in range(batch)]
    if embedded:
        while len(engine._pending) < batch:  # noqa: ASYNC110 (the engine has no event for a queued request)
            await asyncio.sleep(0.001)
        t0 = time.perf_counter()
        await engine.resume()
    else:
        t0 = time.perf_counter()
    tokens = sum(await asyncio.gather(*tasks))
    prefill_s, decode_s = max(firsts) - t0, max(ends) - max(firsts)
    return {"batch": batch, "prompt_tokens": batch * a.prompt, "generated": tokens,
            "prefill_s": round(prefill_s, 3), "prefill_tok_s": round(batch * a.prompt / prefill_s, 1),
            "decode_s": round(decode_s, 3), "decode_tok_s": round((tokens - batch) / decode_s, 2)}  # fmt: skip


async def main(a: argparse.Namespace) -> dict[str, Any]:
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if a.tiny:
            from hrl.train.tiny import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "tiny", seed=0))
        else:
            from hrl.cli.config import materialize_model

            model = materialize_model(a.model)
        vocab = int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])
        out: dict[str, Any] = {"machine": machine(), "engine": a.engine, "model": "tiny" if a.tiny else a.model,
                               "sizes": {k: getattr(a, k) for k in TINY}}  # fmt: skip
        bw = copy_bandwidth(a.bandwidth_mib)
        out["ttft"] = {}
        modes = [("vllm", True)] if a.engine == "vllm" else [("static", False), ("continuous", True)]
        for name, continuous in modes:
            engine = await started(a, model, continuous)
            try:
                out["ttft"][name] = await ttft(engine, a, vocab)
                print(f"ttft {name}: {out['ttft'][name]}", file=sys.stderr, flush=True)
                if continuous:  # the throughput rows: the engine as it serves
                    wb = weight_bytes(engine, model)
                    out["throughput"] = []
                    for batch in a.batches:
                        out["throughput"].append(await throughput(engine, a, batch, vocab))
                        print(f"throughput: {out['throughput'][-1]}", file=sys.stderr, flush=True)
            finally:
                await engine.close()
    out["bandwidth"] = {"copy_bytes_per_s": round(bw), "copy_gib_per_s": round(bw / 2**30, 2), "weight_bytes": wb,
                        "decode_bound_tok_s_batch1": round(bw / wb, 2),
                        "note": "copy bandwidth counts bytes read + written; bound = bandwidth / weight bytes"}  # fmt: skip
    out["machine"]["load_end"] = os.getloadavg()
    out["seconds"] = round(time.perf_counter() - t_start, 1)
    return out


def table(out: dict[str, Any]) -> str:
    lines = [
        "| TTFT of B mid-decode | B TTFT s | A tokens streamed at B's first token | A total s |",
        "|---|---|---|---|",
    ]
    for name, row in out["ttft"].items():
        lines.append(f"| {name} | {row['b_ttft_s']} | {row['a_tokens_at_b_first_token']} of {row['a_tokens']} "
                     f"| {row['a_total_s']} |")  # fmt: skip
    lines += ["", "| batch | prefill tok/s | decode tok/s |", "|---|---|---|"]
    lines += [f"| {r['batch']} | {r['prefill_tok_s']} | {r['decode_tok_s']} |" for r in out["throughput"]]
    bw = out["bandwidth"]
    lines.append(f"\ncopy bandwidth {bw['copy_gib_per_s']} GiB/s, weights {bw['weight_bytes'] / 2**20:.0f} MiB: "
                 f"decode bound at batch 1 {bw['decode_bound_tok_s_batch1']} tok/s")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL, help="model dir, HF id or hrl:NAME (default: SmolLM2-135M)")
    p.add_argument("--engine", choices=["embedded", "vllm"], default="embedded")
    p.add_argument("--tiny", action="store_true", help="a tiny model built on the fly and small sizes (CI)")
    p.add_argument("--prompt", type=int, default=512, help="prompt tokens of the long call and of each batch row")
    p.add_argument("--long-tokens", type=int, default=256, help="tokens the long call generates")
    p.add_argument("--short-prompt", type=int, default=64, help="prompt tokens of the call arriving mid-decode")
    p.add_argument("--short-tokens", type=int, default=16, help="tokens the call arriving mid-decode generates")
    p.add_argument("--arrive-s", type=float, default=2.0, help="seconds after the long call that the short one comes")
    p.add_argument("--decode-tokens", type=int, default=64, help="tokens each batch row generates")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--bandwidth-mib", type=int, default=1024, help="size of the tensor copied to measure bandwidth")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads; 0 = torch's default")
    p.add_argument("--json", type=Path, default=None, help="write the figures as JSON here")
    args = p.parse_args()
    if args.tiny:
        for key, value in TINY.items():
            setattr(args, key, value)
    result = asyncio.run(main(args))
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
