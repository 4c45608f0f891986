"""A sharded trainer (FSDP2 over 2 gloo processes on the CPU) takes the same step as one process: the same
gradients and updated weights to 1e-6, the same HF / peft checkpoint, and it resumes from it."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from hrl.train.trainer import Trainer, TrainerConfig
from tests.train.test_trainer import _batch


def _batch4() -> list:
    return _batch([1.0, -1.0, 0.5, -0.5, 1.0], distinct=True)  # 5 micro-batches of 1: rank 1 runs a padding one


def _step(cfg: TrainerConfig, out: Path) -> dict[str, torch.Tensor]:
    """One step; the full gradient (gathered when sharded), saved to out/ with the checkpoint."""
    trainer = Trainer(cfg)
    grads: list[torch.Tensor] = []
    opt_step = trainer.optimizer.step

    def keep() -> None:
        full = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in trainer._trainable()]
        grads.append(torch.cat([g.flatten() for g in full]))
        opt_step()

    trainer.optimizer.step = keep
    metrics = trainer.step(_batch4())
    trainer.save(out)
    resumed = Trainer(cfg)
    resumed.load(out)
    after = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in resumed._trainable()]
    return {"grad": grads[0], "loss": torch.tensor(metrics["train/loss"]), "resumed": torch.cat([a.detach().flatten() for a in after]),
            "steps": torch.tensor(resumed.steps)}  # fmt: skip


def _worker(rank: int, world: int, port: int, cfg: TrainerConfig, out: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})  # fmt: skip
    torch.set_num_threads(1)
    result = _step(cfg, Path(out) / "ckpt")
    if rank == 0:
        torch.save(result, Path(out) / "result.pt")
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(ckpt.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_two_gloo_ranks_take_the_single_process_step(tiny_model, tmp_path, mode):
    # Adam's first step is lr × g/(|g| + ε): on a gradient near 0 a 1e-9 difference moves the update by up to lr/10,
    # so lr stays small enough for the 1e-6 bound while the step still moves every weight with a gradient by ~lr
    cfg = TrainerConfig(model=tiny_model, mode=mode, lr=3e-5, micro_batch=1, device="cpu")
    single = _step(cfg, tmp_path / "single")
    mp.start_processes(_worker, (2, _free_port(), cfg, str(tmp_path)), nprocs=2, start_method="spawn")
    sharded = torch.load(tmp_path / "result.pt")
    assert single["grad"].abs().max() > 1e-4
    torch.testing.assert_close(sharded["grad"], single["grad"], rtol=0, atol=1e-6)
    torch.testing.assert_close(sharded["loss"], single["loss"], rtol=0, atol=1e-6)
    one, two = _weights(tmp_path / "single"), _weights(tmp_path / "ckpt")
    assert one.keys() == two.keys() and one
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=0, atol=1e-6)
    assert (tmp_path / "ckpt" / ("adapter_config.json" if mode == "lora" else "config.json")).is_file()
    torch.testing.assert_close(sharded["resumed"], single["resumed"], rtol=0, atol=1e-6)
    start = torch.cat([p.detach().flatten() for p in Trainer(cfg)._trainable()])
    assert (single["resumed"] - start).abs().max() > 2e-5  # the step really moved the weights  # --resume: same weights
    assert int(sharded["steps"]) == int(single["steps"]) == 1
