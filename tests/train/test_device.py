"""Device, dtype and micro-batch planning of the trainer (CPU runs; the CUDA paths share this code)."""

from __future__ import annotations

import pytest
import torch

from hrl.train.device import MasterWeights, peak_mem_gib, plan_micro_batches, resolve_device, resolve_dtype
from hrl.train.trainer import Trainer, TrainerConfig
from tests.train.test_trainer import _batch


def test_micro_batches_by_count_keep_order_and_by_tokens_pack_within_the_budget():
    assert plan_micro_batches([5, 9, 2, 7, 3], 2) == [[0, 1], [2, 3], [4]]
    plan = plan_micro_batches([5, 9, 2, 7, 3, 30], 0, tokens=15)
    assert sorted(i for mb in plan for i in mb) == list(range(6))
    lengths = [5, 9, 2, 7, 3, 30]
    assert all(len(mb) * max(lengths[i] for i in mb) <= 15 or len(mb) == 1 for mb in plan), plan
    assert plan == [[2, 4, 0], [3], [1], [5]]  # 2,3,5 → 3×5=15; 7 alone (2×7 > 15 with 9 next); the long one alone


def test_device_and_dtype_resolution():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="auto, cpu, cuda or cuda:N"):
        resolve_device("gpu")
    assert resolve_device("cpu", 1, gpus=[4, 5]) == torch.device("cpu")  # listed GPUs only place a CUDA trainer
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda:0")) == torch.bfloat16
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    assert peak_mem_gib(torch.device("cpu")) > 0.01  # the process's peak RSS


def _grads(trainer: Trainer, batch: list) -> torch.Tensor:
    """The gradient of one optimizer step (the step is taken, the grads kept before it)."""
    grads = []
    opt_step = trainer.optimizer.step

    def keep() -> None:
        grads.append(torch.cat([p.grad.flatten().clone() for p in trainer._trainable()]))
        opt_step()

    trainer.optimizer.step = keep
    trainer.step(batch)
    return grads[0]


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_token_budget_and_checkpointing_give_the_gradient_of_count_micro_batches(tiny_model, mode):
    batch = _batch([1.0, -1.0, 0.5, -0.5], distinct=True)
    batch[1].input_ids += [7, 8, 9]  # uneven lengths, so the token plan differs from the count plan
    for attr in ("loss_mask", "behaviour_logprobs", "weight"):
        getattr(batch[1], attr).extend([0, 0, 0])
    batch[1].versions += [-1, -1, -1]
    base = _grads(Trainer(TrainerConfig(model=tiny_model, mode=mode, micro_batch=1)), batch)
    tokens = _grads(Trainer(TrainerConfig(model=tiny_model, mode=mode, micro_batch_tokens=12)), batch)
    ckpt = _grads(
        Trainer(TrainerConfig(model=tiny_model, mode=mode, micro_batch=4, gradient_checkpointing=True)), batch
    )
    assert base.abs().max() > 0
    torch.testing.assert_close(tokens, base, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ckpt, base, rtol=1e-5, atol=1e-7)


def test_bf16_full_training_keeps_fp32_masters_and_moments(tiny_model, tmp_path):
    trainer = Trainer(TrainerConfig(model=tiny_model, mode="full", dtype="bfloat16", device="cpu", lr=1e-2))
    assert isinstance(trainer.optimizer, MasterWeights)
    p0 = next(iter(trainer._trainable())).detach().clone()
    m = trainer.step(_batch([1.0, -1.0], distinct=True))
    p = next(iter(trainer._trainable()))
    assert p.dtype == torch.bfloat16 and not torch.equal(p, p0)
    state = trainer.optimizer.optimizer.state[trainer.optimizer.masters[0]]
    assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32
    assert torch.equal(p, trainer.optimizer.masters[0].to(torch.bfloat16))  # the model holds the rounded master
    assert m["train/peak_mem_gib"] > 0
    trainer.save(tmp_path / "ckpt")
    again = Trainer(TrainerConfig(model=tiny_model, mode="full", dtype="bfloat16", device="cpu", lr=1e-2))
    again.load(tmp_path / "ckpt")
    assert torch.equal(next(iter(again._trainable())), p) and again.steps == 1
    lora = Trainer(TrainerConfig(model=tiny_model, mode="lora", dtype="bfloat16", device="cpu"))
    assert {q.dtype for q in lora._trainable()} == {torch.float32}  # adapters in fp32 on a bf16 base
    assert isinstance(lora.optimizer, torch.optim.AdamW)


def test_lora_adapters_in_the_models_dtype_train_on_fp32_masters(tiny_model, tmp_path):
    """trainer.lora_dtype: model: bf16 adapters on a bf16 base (the forward as vLLM runs it), their optimizer on fp32
    master copies; a step moves them, and the saved adapter reloads to the same values."""
    cfg = TrainerConfig(model=tiny_model, mode="lora", dtype="bfloat16", device="cpu", lr=1e-2, lora_dtype="model")
    trainer = Trainer(cfg)
    assert {q.dtype for q in trainer._trainable()} == {torch.bfloat16}
    assert isinstance(trainer.optimizer, MasterWeights)
    before = [q.detach().clone() for q in trainer._trainable()]
    trainer.step(_batch([1.0, -1.0], distinct=True))
    after = list(trainer._trainable())
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert all(torch.equal(q, m.to(torch.bfloat16)) for q, m in zip(after, trainer.optimizer.masters, strict=True))
    trainer.save(tmp_path / "ckpt")
    again = Trainer(cfg)
    again.load(tmp_path / "ckpt")
    assert all(torch.equal(a, b) for a, b in zip(again._trainable(), after, strict=True))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_asking_for_cuda_without_it_is_a_prerequisite_error(tiny_model):
    from hrl.runners.errors import PrerequisiteError

    with pytest.raises(PrerequisiteError, match="no CUDA device") as info:
        Trainer(TrainerConfig(model=tiny_model, device="cuda:1"))
    assert "trainer.device=auto" in info.value.hint


def test_master_weights_accumulate_micro_batch_grads_in_fp32():
    # bf16 keeps 8 significant bits: 1 + 2^-9 rounds back to 1, so a bf16 running sum of a 1.0 gradient and 256 of
    # 2^-9 stays 1.0; every partial sum is exact in fp32, so the masters' grad is exactly 1 + 256 · 2^-9 = 1.5
    w = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    opt = MasterWeights([w], lr=0.0)
    for c in [1.0] + [2.0**-9] * 256:
        (w * c).sum().backward()
        assert w.grad is None  # moved into the master's fp32 grad right away
    assert opt.masters[0].grad.dtype == torch.float32
    assert torch.equal(opt.masters[0].grad, torch.full((4,), 1.5))
    opt.step()
    assert opt.masters[0].grad is None and torch.equal(w, torch.zeros(4, dtype=torch.bfloat16))


def test_bf16_full_training_with_a_trust_region_moves_its_fp32_masters(tiny_model):
    """trainer.max_update_kl on bf16 weights: a step the trust region leaves whole must leave the fp32 masters as AdamW
    made them. (They used to be copied back from the bf16 model after every step, so an update below bf16's
    resolution was rounded away: at lr 1e-6 the weights never moved.) Three steps with an unreachable bound end on
    the very masters of three steps without a trust region, and train/update_norm is that of each step."""
    batch = _batch([1.0, -1.0], distinct=True)

    def masters(bound: float) -> tuple[list[torch.Tensor], list[float]]:
        cfg = TrainerConfig(model=tiny_model, mode="full", dtype="bfloat16", device="cpu", lr=1e-6, max_update_kl=bound)
        trainer = Trainer(cfg)
        start = [m.detach().clone() for m in trainer.optimizer.masters]
        norms = [trainer.step(batch)["train/update_norm"] for _ in range(3)]
        moved = [m.detach() - s for m, s in zip(trainer.optimizer.masters, start, strict=True)]
        return moved, norms

    plain, plain_norms = masters(0.0)
    held, held_norms = masters(1e9)
    assert max(float(d.abs().max()) for d in plain) > 0
    assert all(torch.equal(a, b) for a, b in zip(held, plain, strict=True))  # the trust region changed nothing
    assert all(n > 0 for n in held_norms) and held_norms == pytest.approx(plain_norms, rel=1e-6)


@pytest.mark.parametrize(("mode", "bound"), [("lora", 0.0), ("full", 0.02)])
def test_update_norm_is_the_norm_of_what_the_step_changed(tiny_model, mode, bound):
    """train/update_norm (from AdamW's state, no copy of the weights) against the weights before and after a step;
    with a trust region that scales the step back (full, bound 0.02), the scaled step's."""
    batch = _batch([1.0, -1.0], distinct=True)
    lr = 3e-3 if mode == "lora" else 1e-4
    trainer = Trainer(TrainerConfig(model=tiny_model, mode=mode, lr=lr, micro_batch=1, max_update_kl=bound,
                                    weight_decay=0.01))  # fmt: skip
    for _ in range(2):  # the second step has moments from the first
        before = [p.detach().clone() for p in trainer._trainable()]
        m = trainer.step(batch)
        moved = sum(
            float((p.detach() - b).double().pow(2).sum()) for p, b in zip(trainer._trainable(), before, strict=True)
        )
        assert m["train/update_norm"] == pytest.approx(moved**0.5, rel=1e-4), m
    if bound:
        assert m["train/update_scale"] < 1.0, m  # the case that scales was met


def test_trainer_work_runs_on_one_thread_and_gives_freed_memory_back():
    """Every trainer call of the loops goes to one thread (glibc keeps a malloc arena per allocating thread: updates
    spread over to_thread's pool kept one update's peak resident in each, 7 → 21 GiB in nine LoRA steps of a 135M
    model), and what a call freed is trimmed after it."""
    import asyncio
    import threading

    from hrl.train import device
    from hrl.train.step import on_trainer_thread

    trims = []
    real = device.release_free_memory

    async def main() -> set[int]:
        async def one(k: int) -> int:
            await asyncio.to_thread(threading.get_ident)  # other threads in use meanwhile
            return await on_trainer_thread(lambda: threading.get_ident())

        return set(await asyncio.gather(*(one(k) for k in range(8))))

    import hrl.train.step as step

    step.release_free_memory = lambda: (trims.append(1), real())  # type: ignore[assignment]
    try:
        threads = asyncio.run(main())
    finally:
        step.release_free_memory = real  # type: ignore[assignment]
    assert len(threads) == 1 and threading.get_ident() not in threads
    assert len(trims) == 8
