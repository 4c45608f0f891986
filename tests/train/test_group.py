"""trainer.nproc = 2: the loop drives rank 0 as it drives a Trainer; the spawned rank replays each call."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from hrl.train.group import TrainerGroup, make_trainer
from hrl.train.trainer import Trainer, TrainerConfig
from tests.train.test_distributed import _batch4, _weights


def _in_a_new_thread(fn: Any, *args: Any) -> Any:
    """Call fn in a thread of its own, as the loop's `asyncio.to_thread` may: rank 0 is built in one thread and
    stepped in others (torch's current CUDA device is per thread, so nothing may rest on the one set at build)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


def test_a_two_rank_group_steps_saves_and_resumes_like_one_trainer(tiny_model, tmp_path):
    cfg = TrainerConfig(model=tiny_model, mode="full", lr=3e-5, micro_batch=2, device="cpu")
    single = Trainer(cfg)
    m1 = single.step(_batch4())
    lone_single = single.step(_batch4()[:2])
    single.save(tmp_path / "one")
    group = _in_a_new_thread(make_trainer, cfg.model_copy(update={"nproc": 2}))
    assert isinstance(group, TrainerGroup)
    try:
        m2 = _in_a_new_thread(group.step, _batch4())
        lone = group.step(_batch4()[:2])  # one micro-batch: rank 1 runs only a zero-weighted one
        group.save(tmp_path / "two")
        group.load(tmp_path / "two")  # --resume: every rank reloads its shard of weights and optimizer
        lp = torch.cat(group.logprobs(_batch4()))
    finally:
        group.close()
    assert abs(m2["train/loss"] - m1["train/loss"]) < 1e-6 and abs(m2["train/grad_norm"] - m1["train/grad_norm"]) < 1e-5
    assert abs(lone["train/loss"] - lone_single["train/loss"]) < 1e-5 and lone["train/clip_frac"] == 0.0
    one, two = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    assert one.keys() == two.keys()
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=0, atol=1e-6)
    torch.testing.assert_close(lp, torch.cat(single.logprobs(_batch4())), rtol=0, atol=1e-5)
    assert sorted(p.name for p in (tmp_path / "two").glob("optimizer-*")) == [
        "optimizer-rank0-of-2.pt", "optimizer-rank1-of-2.pt"]  # fmt: skip
