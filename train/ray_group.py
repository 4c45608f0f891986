"""`placement.trainer: ray`: the trainer's `trainer.nproc` ranks as Ray actors in one placement group over the
cluster's nodes (`trainer.ranks_per_node` each, or spread), joined into one torch process group (NCCL on GPUs, gloo on
the CPU). Rank 0 is an actor like the others; the driver only orchestrates: every call the loop makes on its trainer
(`RayTrainerGroup`, the same face as `Trainer`) goes to every rank at once, so their collectives line up, and rank
0's answer comes back.

No disk is shared: a checkpoint is written on each rank's node into a scratch folder and its files come back through
Ray to the driver, which writes them into the run directory (model files from rank 0, each rank's optimizer shard
from that rank); `--resume` sends them back the same way. A rank whose actor or node dies ends the call with an
error naming the rank and its node; the run resumes from its last checkpoint.

Ray is imported only here and under `runners/placement/`, and only when the placement is `ray`."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch

from hrl.config import PlacementConfig
from hrl.runners.durable import write_atomically
from hrl.runners.errors import HrlError, PrerequisiteError, UsageError
from hrl.runners.placement.plan import rank_bundles
from hrl.train.trainer import TrainerConfig

__all__ = ["RayTrainerGroup", "TrainerRank"]

_ALL = {"step", "logprobs", "offload", "onload"}  # every rank takes part (FSDP2 collectives); rank 0 answers
_PLACE_TIMEOUT_S = 120.0


def _ray() -> Any:
    from hrl.runners.placement.ray import _ray as ray

    return ray()


class TrainerRank:
    """One rank of the trainer, a Ray actor: a `Trainer` built with torchrun's environment, so it joins the group."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.trainer: Any = None

    def where(self) -> dict[str, Any]:
        """This actor's node and devices, and a free port on its node (rank 0's is the group's rendezvous)."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        from hrl.runners.placement.ray import node_of_this_process

        return {"rank": self.rank, **node_of_this_process(), "port": port}

    def start(self, config: TrainerConfig, master_addr: str, master_port: int) -> dict[str, Any]:
        from hrl.train.trainer import Trainer

        # Ray gives each rank its own GPU (CUDA_VISIBLE_DEVICES): it is cuda:0 in the actor, whatever its index
        os.environ.update({"RANK": str(self.rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(self.world),
                           "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)})  # fmt: skip
        if self.world == 1:  # one rank: no group to join (init_from_env joins one when WORLD_SIZE > 1)
            os.environ["WORLD_SIZE"] = "1"
        self.trainer = Trainer(config)
        return {"device": str(self.trainer.device), "dtype": str(self.trainer.dtype).removeprefix("torch."),
                "takes_images": self.trainer.takes_images, "n_trainable": self.trainer.n_trainable}  # fmt: skip

    def call(self, name: str, args: tuple) -> Any:
        return getattr(self.trainer, name)(*args)

    def save(self) -> dict[str, bytes]:
        """A checkpoint written on this node, as files: rank 0's model files and optimizer shard, another rank's
        optimizer shard only (rank 0 writes what every rank gathered)."""
        with tempfile.TemporaryDirectory(prefix="hrl-rank-ckpt-") as tmp:
            self.trainer.save(tmp)
            files = sorted(p for p in Path(tmp).rglob("*") if p.is_file())
            return {str(p.relative_to(tmp)): p.read_bytes() for p in files}

    def load(self, common: dict[str, bytes], own: dict[str, bytes]) -> None:
        """Load a checkpoint sent as files: those every rank reads (an object ref resolved here) and this rank's."""
        with tempfile.TemporaryDirectory(prefix="hrl-rank-ckpt-") as tmp:
            for name, data in {**common, **own}.items():
                (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / name).write_bytes(data)
            self.trainer.load(tmp)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _uses_gpus(config: TrainerConfig, cluster: dict[str, float]) -> bool:
    if config.device == "cpu":
        return False
    if config.device.startswith("cuda"):
        return True
    return cluster.get("GPU", 0) >= config.nproc  # auto: GPUs when the cluster has one per rank


def bundles(config: TrainerConfig, gpus: bool) -> tuple[list[dict[str, float]], str, list[int]]:
    """The placement group for the ranks: its bundles, strategy, and each rank's bundle. With `ranks_per_node`
    one bundle per node holds that many ranks (STRICT_SPREAD: distinct nodes); else one bundle per rank, spread.
    What the config cannot place (nproc not a multiple, trainer.gpus, weight_sync=ipc) `check_plan` refused."""
    n, per = config.nproc, config.ranks_per_node
    assert not per or n % per == 0, "refused before the run starts (runners.placement.plan.check_plan)"
    count, size, strategy = rank_bundles(n, per)
    one = {"CPU": float(size), **({"GPU": float(size)} if gpus else {})}
    return [dict(one) for _ in range(count)], strategy, [r // size for r in range(n)]


class RayTrainerGroup:
    """The loop's trainer when its ranks are Ray actors: what `Trainer` offers, each call on every rank at once."""

    def __init__(self, config: TrainerConfig, pcfg: PlacementConfig) -> None:
        ray = _ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.config, self.pcfg = config, pcfg
        self.media_dir: Path | None = None  # the loop sets it; images are refused below (they live on the driver)
        cluster = ray.cluster_resources()
        gpus = _uses_gpus(config, cluster)
        specs, strategy, index = bundles(config, gpus)
        self.group = placement_group(specs, strategy=strategy, name=f"hrl-trainer-{os.getpid()}")
        self.actors: list[Any] = []
        try:
            ready, _ = ray.wait([self.group.ready()], timeout=_PLACE_TIMEOUT_S)
            if not ready:
                raise PrerequisiteError(
                    f"the trainer's {config.nproc} rank(s) need {len(specs)} x {specs[0]} ({strategy}) and the cluster "
                    f"could not place them in {_PLACE_TIMEOUT_S:.0f} s: it has {dict(sorted(cluster.items()))}",
                    hint="add nodes, or lower trainer.nproc / trainer.ranks_per_node, or -c trainer.device=cpu",
                )
            rank_cls = ray.remote(TrainerRank)
            for r in range(config.nproc):
                strategy_r = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=index[r])
                self.actors.append(rank_cls.options(num_cpus=1, num_gpus=1 if gpus else 0, max_restarts=0,
                                                    scheduling_strategy=strategy_r).remote(r, config.nproc))  # fmt: skip
            self.ranks: list[dict[str, Any]] = self._each("where", [a.where.remote() for a in self.actors])
            master = self.ranks[0]
            infos = self._each(
                "start", [a.start.remote(config, master["node_ip"], master["port"]) for a in self.actors]
            )
        except BaseException:
            self._kill()
            with contextlib.suppress(Exception):
                remove_placement_group(self.group)
            raise
        for rank, info in zip(self.ranks, infos, strict=True):
            rank.pop("port")
            rank["devices"] = [info["device"]] if info["device"] != "cpu" else rank["devices"]
        first = infos[0]
        if first["takes_images"]:
            self.close()
            raise UsageError("placement.trainer=ray does not train vision models yet: the images of a run are kept "
                             "on the driver's node, not shipped to the ranks",
                             hint="use placement.trainer=driver for a vision model")  # fmt: skip
        self.rank_device, self.dtype = first["device"], getattr(torch, first["dtype"])
        self.takes_images, self.n_trainable = False, first["n_trainable"]
        # what the driver does with a device of its own: nothing (no weights here). Per-phase GPU peaks are the
        # ranks' and are not logged (absent, never this process's figure); a distillation teacher loads here.
        self.device = torch.device("cpu")

    # ---- the calls --------------------------------------------------------------------------------------------
    def _each(self, what: str, refs: list[Any]) -> list[Any]:
        """Every rank's answer, in rank order. A rank that died (its actor, or its node) is an error naming it, as
        soon as it is known: the others wait in a collective that will not complete, so they are stopped too."""
        ray = _ray()
        index = {ref: r for r, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except ray.exceptions.RayActorError as e:
                r = index[done[0]]
                where = getattr(self, "ranks", None)
                node = f"node {where[r]['node_id'][:12]} ({where[r]['node_ip']})" if where else "its node"
                self._kill()
                raise HrlError(
                    f"trainer rank {r} on {node} died during {what}: {str(e).strip().splitlines()[0][:300]}",
                    hint="the step did not finish; run the same command with --resume to go on from the last "
                    "checkpoint once the cluster has its nodes again",
                ) from e
        return ray.get(refs)

    def _all(self, name: str, *args: Any) -> Any:
        shared = _ray().put(args)  # one copy in the object store, read by every rank
        return self._each(name, [a.call.remote(name, shared) for a in self.actors])[0]

    def __getattr__(self, name: str) -> Any:
        if name in _ALL:
            return lambda *args: self._all(name, *args)
        raise AttributeError(f"{name!r}: not offered by a trainer whose ranks are Ray actors")

    def lr_info(self) -> dict[str, float]:
        return self._each("lr_info", [self.actors[0].call.remote("lr_info", ())])[0]  # type: ignore[no-any-return]

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        raise UsageError("weight_sync=ipc reads the trainer's GPU memory in this process; with placement.trainer=ray "
                         "the weights live in the ranks", hint="use -c engine_options.weight_sync=disk")  # fmt: skip

    def save(self, out_dir: str | Path) -> Path:
        """Every rank saves on its node; the files come back here and are written into `out_dir`."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for files in self._each("save", [a.save.remote() for a in self.actors]):
            for name, data in files.items():
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                write_atomically(out / name, data)
        return out

    def load(self, checkpoint: str | Path) -> None:
        """A checkpoint of the run directory, sent to every rank: the model files, and each rank its optimizer shard."""
        ckpt = Path(checkpoint)
        files = {str(p.relative_to(ckpt)): p for p in sorted(ckpt.rglob("*")) if p.is_file()}
        common = _ray().put({n: p.read_bytes() for n, p in files.items() if not n.startswith("optimizer")})
        refs = []
        for r, actor in enumerate(self.actors):
            own = f"optimizer-rank{r}-of-{self.config.nproc}.pt" if self.config.nproc > 1 else "optimizer.pt"
            mine = {own: files[own].read_bytes()} if own in files else {}
            refs.append(actor.load.remote(common, mine))
        self._each("load", refs)

    def close(self) -> None:
        """Leave the group on every rank, then stop the actors and free their placement group."""
        ray = _ray()
        with contextlib.suppress(Exception):
            ray.get([a.close.remote() for a in self.actors], timeout=60)
        self._kill()
        from ray.util.placement_group import remove_placement_group

        with contextlib.suppress(Exception):
            remove_placement_group(self.group)

    def _kill(self) -> None:
        for a in self.actors:
            with contextlib.suppress(Exception):
                _ray().kill(a)
