"""The colocated memory plan: which state `trainer.offload` moves out while the engine serves, that it comes back
bit for bit and the next step is the step it would have been, and that the loop offloads before the engine wakes.
The CPU trainer runs the mover for real (each tensor copied to a fresh host buffer and back); the `gpu` tests run
the same checks between a GPU and pinned host memory."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from hrl.runners.engines.base import Engine
from hrl.train.offload import Offloader, PhasePeaks, engine_share, optimizer_tensors, resolve_offload
from hrl.train.step import offload_plan, sleep, wake
from hrl.train.trainer import Trainer, TrainerConfig
from tests.train.test_trainer import _batch


@pytest.mark.parametrize(
    ("mode", "sleep_level", "ipc", "cuda", "nproc", "plan"),
    [
        ("full", 0, False, True, 1, "none"),  # split layout: the engine never sleeps
        ("full", 1, False, True, 1, "optimizer"),
        ("full", 2, False, True, 1, "all"),  # the engine drops its weights: the GPU is tightest
        ("full", 2, True, True, 1, "optimizer"),  # the IPC publish reads the weights on the GPU
        ("lora", 1, False, True, 1, "optimizer"),
        ("full", 2, False, False, 1, "none"),  # a CPU trainer: no device memory to free
        ("full", 2, False, True, 2, "none"),  # FSDP2 already splits the state
    ],
)
def test_auto_picks_what_the_layout_frees(mode, sleep_level, ipc, cuda, nproc, plan):
    assert resolve_offload("auto", mode, sleep_level, ipc=ipc, cuda=cuda, nproc=nproc) == plan
    assert resolve_offload("none", mode, sleep_level, ipc=ipc, cuda=cuda, nproc=nproc) == "none"  # as asked


def test_an_explicit_offload_with_a_sharded_trainer_is_refused(tiny_model):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"trainer.offload=optimizer .* trainer.nproc=2"):
        TrainerConfig(model=tiny_model, offload="optimizer", nproc=2)
    assert TrainerConfig(model=tiny_model, nproc=2).offload == "auto"


def _state(trainer: Trainer) -> list[torch.Tensor]:
    """Everything a step reads: the weights, the optimizer's state and (MasterWeights) its fp32 masters."""
    return [*trainer.model.parameters(), *optimizer_tensors(trainer.optimizer)]


def _round_trip_and_step(tiny_model: str, device: str, mode: str, dtype: str, plan: str) -> None:
    cfg = TrainerConfig(model=tiny_model, mode=mode, dtype=dtype, device=device, lr=1e-2, micro_batch=2)
    moved, stayed = Trainer(cfg), Trainer(cfg)  # same seed: the same starting weights and adapters
    for trainer in (moved, stayed):
        trainer.step(_batch([1.0, -1.0], distinct=True))
    before = [(t.device, t.data_ptr(), t.detach().clone()) for t in _state(moved)]
    n_opt = len(optimizer_tensors(moved.optimizer))
    assert n_opt > 0  # the step made AdamW's moments

    metrics = moved.offload(plan)
    expect = before[-n_opt:] if plan == "optimizer" else before
    away = _state(moved)[-n_opt:] if plan == "optimizer" else _state(moved)
    host_bytes = sum(t.numel() * t.element_size() for _, _, t in expect)
    assert metrics["offload/gib"] * 2**30 == host_bytes
    for t, (_, ptr, value) in zip(away, expect, strict=True):
        assert t.device.type == "cpu" and t.data_ptr() != ptr  # a host copy now, not the old buffer
        assert t.is_pinned() == torch.cuda.is_available()
        assert torch.equal(t, value)
    if plan == "optimizer":  # the weights stayed where they were
        assert all(t.data_ptr() == ptr for t, (_, ptr, _) in zip(_state(moved)[:-n_opt], before, strict=False))
    assert all(p.grad is None for p in moved.model.parameters())  # dropped: every step starts without

    moved.onload()
    for t, (home, _, value) in zip(_state(moved), before, strict=True):
        assert t.device == home and torch.equal(t, value)  # bit for bit, where it was
    second = _batch([-1.0, 0.5], distinct=True)
    a, b = moved.step(second), stayed.step(second)
    assert a["train/loss"] == b["train/loss"]
    for x, y in zip(_state(moved), _state(stayed), strict=True):
        assert torch.equal(x, y)  # the step after the round trip is the step without it, bit for bit


@pytest.mark.parametrize(
    ("mode", "dtype", "plan"),
    [("full", "bfloat16", "all"), ("full", "float32", "optimizer"), ("lora", "float32", "all")],
)
def test_offloaded_state_round_trips_bitwise_and_the_next_step_is_unchanged(tiny_model, mode, dtype, plan):
    """bf16 full: bf16 weights with fp32 masters (MasterWeights); fp32 full: AdamW on the weights; LoRA: AdamW on
    the fp32 adapters, the frozen base moved with them under `all`."""
    _round_trip_and_step(tiny_model, "cpu", mode, dtype, plan)


@pytest.mark.gpu
@pytest.mark.parametrize(("mode", "plan"), [("full", "all"), ("lora", "optimizer")])
def test_offloaded_state_round_trips_between_the_gpu_and_pinned_memory(tiny_model, mode, plan):
    _round_trip_and_step(tiny_model, "cuda", mode, "bfloat16", plan)


@pytest.mark.gpu
def test_offload_hands_the_memory_back_to_the_driver(tiny_model):
    trainer = Trainer(TrainerConfig(model=tiny_model, mode="full", device="cuda"))
    trainer.step(_batch([1.0, -1.0], distinct=True))
    on_gpu = sum(t.numel() * t.element_size() for t in _state(trainer) if t.is_cuda)
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    trainer.offload("all")
    # every GPU byte of the state left (the allocator rounds blocks up: it may free more), and the allocator's cache
    # went back to the driver: what it reserves fell, and holds no more unused memory than before
    assert allocated - torch.cuda.memory_allocated() >= on_gpu > 0
    assert torch.cuda.memory_reserved() < reserved
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() <= reserved - allocated


def test_the_mover_skips_a_tensor_named_twice_and_sends_each_home():
    mover = Offloader("cpu", pin=False)
    a, b = torch.arange(4.0), torch.arange(3, dtype=torch.int64)
    ptr = a.data_ptr()
    assert mover.offload([a, b, a]) == 4 * 4 + 3 * 8  # a once
    assert mover.offload([a]) == 0 and len(mover.away) == 2  # already away
    assert a.data_ptr() != ptr and torch.equal(a, torch.arange(4.0))
    assert mover.onload() == 4 * 4 + 3 * 8 and mover.away == [] and mover.bytes_away == 0


def test_host_copies_share_blocks_sized_to_what_they_hold():
    """10 tensors of 100 bytes take 128 each (64-byte aligned): 8 fill a 1024-byte block, the last 2 take 256, the
    power of two above their 256 bytes; not ten allocations rounded up one by one."""
    mover = Offloader("cpu", pin=False, block_bytes=1024)
    tensors = [torch.full((25,), float(i)) for i in range(10)]  # 25 float32 = 100 bytes
    assert mover.offload(tensors) == 1000
    blocks = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    assert sorted(blocks.values()) == [256, 1024]
    assert all(torch.equal(t, torch.full((25,), float(i))) for i, t in enumerate(tensors))
    mover.onload()
    assert all(t.untyped_storage().nbytes() == 100 for t in tensors)  # their own storage again


def test_phase_peaks_say_nothing_on_the_cpu():
    """The OS keeps one high-water mark per process: no per-phase figure would be what its name says."""
    peaks = PhasePeaks(torch.device("cpu"))
    peaks.start()
    assert peaks.end("update") == {}


@pytest.mark.gpu
def test_phase_peaks_measure_each_phase_apart():
    peaks = PhasePeaks(torch.device("cuda:0"))
    peaks.start()
    big = torch.empty(2**28, dtype=torch.uint8, device="cuda:0")  # 0.25 GiB
    del big
    first = peaks.end("update")["mem/peak_gib/update"]
    second = peaks.end("publish")["mem/peak_gib/publish"]
    assert first >= 0.25 > second  # the second phase allocated nothing new


class _SleepingEngine(Engine):
    """An engine with vLLM's sleep mode, as the loop sees it: it records whether the trainer still held its
    optimizer state on its own device when it was woken."""

    name, version = "sleeping", 0

    def __init__(self, trainer: Trainer, sleep_level: int) -> None:
        self.sleep_level = sleep_level
        self.trainer, self.calls = trainer, []

    async def sleep(self) -> None:
        self.calls.append(("sleep", len(self.trainer._offloader.away)))

    async def wake_up(self) -> None:
        self.calls.append(("wake_up", len(self.trainer._offloader.away)))


def test_the_loop_offloads_before_the_engine_wakes_and_onloads_after_it_sleeps(tiny_model):
    trainer = Trainer(TrainerConfig(model=tiny_model, mode="full", device="cpu", offload="optimizer", micro_batch=2))
    trainer.step(_batch([1.0, -1.0], distinct=True))
    engine = _SleepingEngine(trainer, sleep_level=1)
    publisher = SimpleNamespace(engine=engine)
    assert offload_plan(engine, trainer) == "optimizer"
    n = len(optimizer_tensors(trainer.optimizer))
    moved = asyncio.run(wake(publisher, trainer))
    assert moved["offload/gib"] > 0
    asyncio.run(sleep(publisher, trainer))
    assert engine.calls == [("wake_up", n), ("sleep", n)]  # offloaded when the engine woke, back after it slept
    assert trainer._offloader.away == []
    auto = Trainer(TrainerConfig(model=tiny_model, mode="full", device="cpu"))
    assert offload_plan(engine, auto) == "none"  # auto on the CPU: nothing to free
    assert asyncio.run(wake(SimpleNamespace(engine=engine), auto)) == {}


def test_offloading_the_weights_that_an_ipc_publish_reads_is_refused_before_any_work(tiny_model, tmp_path):
    from hrl.runners.engines.vllm import VLLMEngine, VLLMEngineConfig
    from hrl.runners.errors import HrlError
    from hrl.runners.rundir import RunDir
    from hrl.train.loop import LoopConfig, train
    from tests.train.test_loop import TASKS, ChatRollouts, EnginePublisher

    engine = VLLMEngine(VLLMEngineConfig(model=tiny_model, sleep_level=2, weight_sync="ipc"))  # never started
    cfg = LoopConfig(iterations=1, trainer=TrainerConfig(model=tiny_model, mode="full", offload="all"))
    run = RunDir(tmp_path / "run")
    run.create(cfg.model_dump())
    with pytest.raises(HrlError, match="weight_sync=ipc") as info:
        asyncio.run(train(TASKS, cfg, run, EnginePublisher(engine), ChatRollouts(None, "")))  # type: ignore[arg-type]
    assert "trainer.offload=optimizer" in info.value.hint


def test_the_engine_share_is_what_the_trainer_and_the_headroom_leave_rounded_down():
    """vLLM's gpu_memory_utilization beside a trainer that never lets go: (total - trainer peak - headroom) / total,
    rounded down so the two never add up past the GPU; a trainer that leaves under 5 % is refused with its figures."""
    gib = 2**30
    assert engine_share(30 * gib, 80 * gib) == 0.61  # (80 - 30 - 1) / 80 = 0.6125
    assert engine_share(30 * gib, 80 * gib, headroom_bytes=0) == 0.62  # 0.625 rounded down, never up
    share = engine_share(10 * gib + 1, 141 * gib)
    assert share * 141 * gib + 10 * gib + 1 + gib <= 141 * gib  # the sum stays inside the GPU
    with pytest.raises(ValueError, match=r"76\.0 GiB leaves the engine 4 % of this 80 GiB GPU"):
        engine_share(76 * gib, 80 * gib)
