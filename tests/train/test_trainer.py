"""The trainer against the real proxy and engine: train/infer mismatch, and a reward that rises."""

from __future__ import annotations

import asyncio
import math
import statistics

import httpx
import pytest

from hrl.runners.proxy.proxy import Proxy
from hrl.runners.serving.stack import serving
from hrl.train.advantages import group_advantages
from hrl.train.samples import build_samples
from hrl.train.trainer import Trainer, TrainerConfig

PROMPTS = ["fix the bug", "run the tests", "list files", "read m.py"]


def _reward(text: str) -> float:
    """What the 'task' wants: answers rich in the letter e (any policy can move this)."""
    return text.count("e") / max(len(text), 1)


async def _episode(client: httpx.AsyncClient, url: str, proxy: Proxy, prompt: str, group: str, seed: int) -> dict:
    token = proxy.open_session(meta={"task_id": group, "group_id": group}).token
    # a seed per request: what each episode samples depends on the weights alone, not on how the engine happened to
    # batch the concurrent requests (which varies with the machine's load)
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 12, "temperature": 1.0, "seed": seed}
    r = await client.post(f"{url}/s/{token}/v1/chat/completions", json=body)
    text = r.json()["choices"][0]["message"]["content"] or ""
    return proxy.end_session(token, reward=_reward(text))


async def _iterations(
    model: str, n_iter: int, k: int, cfg: TrainerConfig, tmp
) -> tuple[list[list[float]], list[float]]:
    """The episodes' rewards per iteration, and the mismatch KL of each step."""
    rewards, mismatch = [], []
    opts = {"dtype": "float32"}
    async with (
        serving(model, model_name="tiny", engine_options=opts) as stack,
        httpx.AsyncClient(timeout=120) as client,
    ):
        trainer = Trainer(cfg)  # after the engine loads, as before
        for it in range(n_iter):
            traces = await asyncio.gather(
                *[
                    _episode(client, stack.url, stack.proxy, p, f"{it}-{p}", seed=1000 * it + k * i + j)
                    for i, p in enumerate(PROMPTS)
                    for j in range(k)
                ]
            )
            rewards.append([t["reward"] for t in traces])
            adv, _ = group_advantages(
                {t["trace_id"]: t["reward"] for t in traces}, {t["trace_id"]: t["group_id"] for t in traces}
            )
            samples = [s for t in traces for s in build_samples(t)]
            for s in samples:
                s.advantage = adv[s.trace_id]
            metrics = await asyncio.to_thread(trainer.step, samples)
            mismatch.append(metrics["train/mismatch_kl"])
            path = await asyncio.to_thread(trainer.save, tmp / f"v{it + 1}")
            await stack.engine.publish(str(path), cfg.mode)
    return rewards, mismatch


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_reward_rises_through_real_proxy_and_engine(tiny_model, tmp_path, mode):
    lr = 5e-2 if mode == "lora" else 2e-2
    cfg = TrainerConfig(model=tiny_model, mode=mode, lr=lr, micro_batch=16, lora_rank=8)
    rewards, mismatch = asyncio.run(_iterations(tiny_model, 8, 8, cfg, tmp_path))
    curve = [statistics.mean(r) for r in rewards]
    sem = [statistics.stdev(r) / math.sqrt(len(r)) for r in rewards]
    # each trained iteration against the untrained one, in standard errors of the two means
    z = [(curve[i] - curve[0]) / max(math.hypot(sem[i], sem[0]), 1e-12) for i in range(1, len(curve))]
    print(f"\n{mode}: reward per iteration {[round(x, 3) for x in curve]}; z {[round(x, 1) for x in z]}; "
          f"max mismatch KL {max(mismatch):.2e}")  # fmt: skip
    # k3 KL ≈ Δ²/2: fp32 rounding (|Δlogp| ~1e-5) gives ~1e-10; 1e-3 is a logprob off by ~0.045 on every token
    assert max(mismatch) <= 1e-3  # trainer vs engine logprobs on the same weights, fp32
    # Seeded, but a rounding difference (another CPU's kernels) can flip a sampled token and send the run down another
    # trajectory, which may rise and then collapse; so the bound is statistical: the best of the 7 trained iterations
    # beats the untrained one by 3.5 standard errors (with no learning: p < 7 × 1e-3; learning runs reach 13 or more)
    assert max(z) > 3.5, (curve, z)


def _batch(advantages: list[float], distinct: bool = False) -> list:
    """One 6-token sample per advantage, loss on its last 3 tokens (the same ids unless `distinct`)."""
    from hrl.train.samples import Sample

    return [
        Sample(
            f"t{i}",
            "g",
            ["a"],
            [1, 2, 3, 4 + 3 * i * distinct, 5 + 3 * i * distinct, 6 + 3 * i * distinct],
            [0, 0, 0, 1, 1, 1],
            [0, 0, 0, -1.0, -1.0, -1.0],
            [-1, -1, -1, 0, 0, 0],
            [0, 0, 0, 1 / 3, 1 / 3, 1 / 3],
            advantage=a,
        )
        for i, a in enumerate(advantages)
    ]


def test_a_batch_without_signal_leaves_the_weights_alone(tiny_model):
    """All advantages zero (every group agreed): no optimizer step. Adam would otherwise keep moving every weight by
    its momentum from earlier steps, drifting the policy with zero gradient."""
    import torch

    batch = _batch
    trainer = Trainer(TrainerConfig(model=tiny_model, mode="full", lr=1e-2, micro_batch=4))

    def weights() -> torch.Tensor:
        return torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])

    w0 = weights()
    assert trainer.step(batch([1.0, -1.0], distinct=True))["train/skipped"] == 0.0  # same ids would cancel exactly
    w1 = weights()
    assert not torch.equal(w0, w1)  # a real step moved them (and left Adam momentum behind)
    metrics = trainer.step(batch([0.0, 0.0]))
    assert metrics["train/skipped"] == 1.0 and metrics["train/grad_norm"] == 0.0
    assert torch.equal(weights(), w1)
    assert not torch.equal((trainer.step(batch([-1.0, 1.0])), weights())[1], w1)


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_kl_term_holds_the_policy_near_its_start(tiny_model, mode):
    """kl_coef > 0: a k3 KL to the starting weights (LoRA: adapters off; full: a frozen copy) joins the loss. It is
    exactly 0 on the first step and holds the policy closer to where it started than the same updates without it."""
    import torch

    batch = _batch([1.0, -1.0], distinct=True)

    def drift(kl_coef: float) -> tuple[float, list[float]]:
        trainer = Trainer(TrainerConfig(model=tiny_model, mode=mode, lr=2e-2, micro_batch=1, kl_coef=kl_coef))
        start = torch.cat(trainer.logprobs(batch))
        kls = [trainer.step(batch).get("train/kl_ref", -1.0) for _ in range(6)]
        return float((torch.cat(trainer.logprobs(batch)) - start).abs().mean()), kls

    free, no_kl = drift(0.0)
    held, kls = drift(5.0)
    assert no_kl == [-1.0] * 6  # no KL term, no metric
    assert kls[0] == 0.0 and all(k > 0 for k in kls[1:]), kls
    print(f"\n{mode}: mean |Δlogp| after 6 steps: {free:.3f} without the KL term, {held:.3f} with it; KL {kls}")
    assert held < 0.7 * free, (held, free)


@pytest.mark.parametrize(("mode", "lr"), [("full", 1e-4), ("lora", 3e-3)])
def test_trust_region_scales_back_a_step_that_moves_the_policy_too_far(tiny_model, mode, lr):
    """max_update_kl: a step whose KL on its own batch exceeds the bound is scaled back (halving), or undone when
    even 1/8 of it is too far; a step within the bound is left as it was. KLs re-measured here, independently."""
    import torch

    batch = _batch([1.0, -1.0], distinct=True)

    def step(lr: float, bound: float) -> tuple[dict, float, Trainer]:
        trainer = Trainer(TrainerConfig(model=tiny_model, mode=mode, lr=lr, micro_batch=1, max_update_kl=bound))
        before = torch.cat(trainer.logprobs(batch))
        m = trainer.step(batch)
        d = (torch.cat(trainer.logprobs(batch)) - before).double()
        return m, float((torch.exp(d) - d - 1).mean()), trainer

    free, kl_free, _ = step(lr, 1e9)  # no effective bound: the whole step
    assert free["train/update_scale"] == 1.0 and kl_free == pytest.approx(free["train/update_kl"], rel=1e-3)
    held, kl_held, _ = step(lr, 0.02)
    assert held["train/update_kl_full_step"] == pytest.approx(kl_free, rel=1e-3)
    assert 0 < held["train/update_scale"] < 1.0 and kl_held <= 0.02, held
    assert held["train/update_kl"] == pytest.approx(kl_held, rel=1e-3)
    undone, kl_undone, trainer = step(lr, 1e-6)
    assert undone["train/update_scale"] == 0.0 and kl_undone == 0.0
    start = Trainer(TrainerConfig(model=tiny_model, mode=mode, lr=lr))
    for p, q in zip(trainer._trainable(), start._trainable(), strict=True):
        assert torch.equal(p, q)  # undone exactly
    small, _, _ = step(1e-6, 0.02)
    assert small["train/update_scale"] == 1.0, small
    print(
        f"\n{mode} lr {lr}: whole step KL {kl_free:.3f}; bound 0.02: scale {held['train/update_scale']}, "
        f"KL {kl_held:.4f}"
    )


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_ppo_epochs_and_mini_batches_move_the_ratio_so_clipping_acts(tiny_model, mode):
    """One optimizer step per batch measures the ratio at its own start (always 1). With 2 epochs × 2 mini-batches
    the old logprobs are those before the first step, so later steps see ratios ≠ 1 and some tokens get clipped."""
    batch = _batch([1.0, -1.0, 1.0, -1.0], distinct=True)
    lr = 3e-2 if mode == "lora" else 1e-2
    one = Trainer(TrainerConfig(model=tiny_model, mode=mode, lr=lr, micro_batch=2)).step(batch)
    assert one["train/optimizer_steps"] == 1.0
    assert one["train/clip_frac"] == 0.0 and one["train/ratio_max"] == pytest.approx(1.0, abs=1e-5)
    m = Trainer(TrainerConfig(model=tiny_model, mode=mode, lr=lr, micro_batch=2)).step(batch, 2, 2)
    print(f"\n{mode}: clip_frac {m['train/clip_frac']:.3f}, ratio max {m['train/ratio_max']:.3f}, "
          f"approx KL {m['train/approx_kl']:.4f}")  # fmt: skip
    assert m["train/optimizer_steps"] == 4.0
    assert m["train/clip_frac"] > 0 and m["train/ratio_max"] > 1.2 and m["train/approx_kl"] > 0, m
