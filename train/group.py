"""`trainer.nproc: N`: the trainer as an N-rank job. Rank 0 lives in the calling process (the loop talks to it as
to a Trainer); ranks 1…N-1 are spawned with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) and replay every call rank 0 makes, broadcast over a gloo control group, so their collectives line
up. Under a real `torchrun`, build a Trainer in every rank instead: it joins the job from the environment."""

from __future__ import annotations

import os
import queue
import socket
import threading
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from hrl.train.trainer import Trainer, TrainerConfig

__all__ = ["TrainerGroup", "make_trainer"]

_REPLAYED = {"step", "save", "load", "logprobs", "save_optimizer", "offload", "onload"}


def make_trainer(config: TrainerConfig) -> Trainer | TrainerGroup:
    return TrainerGroup(config) if config.nproc > 1 else Trainer(config)


def _env(rank: int, world: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip


def _follower(i: int, world: int, port: int, config: TrainerConfig) -> None:
    """Rank i + 1: build the same trainer, then run each call rank 0 broadcasts until it says stop."""
    os.environ.update(_env(i + 1, world, port))
    trainer = Trainer(config)
    control = dist.new_group(backend="gloo")
    while True:
        msg: list[Any] = [None]
        dist.broadcast_object_list(msg, src=0, group=control)
        name, args = msg[0]
        if name == "stop":
            break
        getattr(trainer, name)(*args)
    dist.destroy_process_group()


class TrainerGroup:
    """A Trainer whose step / save / load / logprobs run on every rank of an N-process job (FSDP2 shards)."""

    def __init__(self, config: TrainerConfig) -> None:
        world = config.nproc
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self._closed = threading.Event()
        self._ctx = self._spawn((world, port, config), world - 1)
        saved = {k: os.environ.get(k) for k in _env(0, world, port)}
        os.environ.update(_env(0, world, port))
        try:
            self.trainer = Trainer(config)
        finally:
            for k, v in saved.items():  # the loop's own process is not a torchrun rank
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v
        self._control = dist.new_group(backend="gloo")

    def _spawn(self, args: tuple, n: int) -> Any:
        """Start the other ranks from a thread that lives until close(): torch's spawn ties each child to the thread
        that started it (PR_SET_PDEATHSIG), and the loop builds the group in a worker thread that may end at once."""
        started: queue.Queue = queue.Queue()

        def keep() -> None:
            try:
                started.put(mp.start_processes(_follower, args, nprocs=n, join=False, start_method="spawn"))
            except BaseException as e:  # handed to the caller
                started.put(e)
                return
            self._closed.wait()

        threading.Thread(target=keep, name="trainer-ranks", daemon=True).start()
        ctx = started.get()
        if isinstance(ctx, BaseException):
            raise ctx
        return ctx

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.trainer, name)
        if name not in _REPLAYED:
            return attr

        def replayed(*args: Any) -> Any:
            dist.broadcast_object_list([(name, args)], src=0, group=self._control)
            return attr(*args)

        return replayed

    def close(self) -> None:
        """Stop the other ranks and leave the job."""
        if dist.is_initialized():
            dist.broadcast_object_list([("stop", ())], src=0, group=self._control)
            self._ctx.join()
            dist.destroy_process_group()
        self._closed.set()
