"""What a run would start where, from its resolved config alone (`hrl train --dry-run`, `hrl rollout --dry-run`).

`plan` is pure: it reads the config and nothing else (no Ray, no engine, no Docker, no model files), so a plan for a
cluster can be read on a laptop before a single node is booked. What only the cluster can say (how many nodes are
alive, whether `trainer.device: auto` finds a GPU, which node a replica lands on) is said as the rule the run
applies there. The placement rules a run cannot start with are refused here as the run refuses them (`check_plan`).
"""

from __future__ import annotations

from typing import Any

from hrl.config import PlacementConfig, RunConfig
from hrl.runners.errors import UsageError

__all__ = ["check_names", "check_plan", "describe", "plan", "rank_bundles", "replica_cpus"]

_WEIGHTS = {
    "disk": "each replica reads the checkpoint at its run-directory path (one node, or a shared file system)",
    "ship": "sent through Ray's object store and written on each replica's node (checked by sha256 and version)",
    "auto": "ship when a replica runs on another node than the driver, else disk (decided once they are placed)",
}
_BACKEND = {
    "driver": "nccl on a GPU, gloo on the CPU (trainer.device=auto)",
    "ray": "nccl when the cluster has a GPU for every rank, else gloo on the CPU (trainer.device=auto)",
}


def replica_cpus(pcfg: PlacementConfig) -> float:
    """The CPUs one engine replica reserves on Ray: `replica_cpus`, and at least one for a GPU replica (its placement
    group's bundle needs a CPU beside the GPUs). `runners.placement.ray` reserves this; the plan shows it."""
    return max(1.0, pcfg.replica_cpus) if pcfg.replica_gpus else pcfg.replica_cpus


def rank_bundles(nproc: int, ranks_per_node: int) -> tuple[int, int, str]:
    """How the trainer's ranks sit in their placement group on Ray: (bundles, ranks a bundle, strategy). With
    `ranks_per_node` one bundle per node holds that many ranks (STRICT_SPREAD: distinct nodes); else one bundle per
    rank, spread. `hrl.train.ray_group` builds this group; the plan shows it."""
    size = ranks_per_node or 1
    return nproc // size, size, "STRICT_SPREAD" if ranks_per_node else "SPREAD"


def check_plan(settings: RunConfig) -> None:
    """The trainer's Ray placement checked against the rest of the config, refused here, before
    the run starts: on the cluster they would surface only once Ray is joined and replicas are up, after minutes of a
    cluster's time (`hrl.train.ray_group` relies on it)."""
    trainer = settings.trainer
    if settings.placement.trainer != "ray":
        return
    n, per = trainer.nproc, trainer.ranks_per_node
    if per and n % per:
        raise UsageError(f"trainer.nproc={n} is not a multiple of trainer.ranks_per_node={per}",
                         hint=f"use -c trainer.nproc={per * max(1, round(n / per))}")  # fmt: skip
    if trainer.gpus:
        raise UsageError(
            "trainer.gpus picks GPUs of this machine; with placement.trainer=ray Ray gives each rank its GPU",
            hint="drop trainer.gpus (trainer.ranks_per_node places ranks per node)",
        )
    if settings.engine_options.get("weight_sync") == "ipc":
        raise UsageError(
            "weight_sync=ipc reads the trainer's GPU memory in this process; with placement.trainer=ray the weights "
            "live in the ranks",
            hint="use -c engine_options.weight_sync=disk",
        )


def check_names(settings: RunConfig) -> None:
    """The names the config gives (agent CLIs, sandbox, engine) known to hrl, as a run checks them first; what this
    machine has (Docker, a vLLM interpreter, Ray, the model's files) is not looked at: a plan is read anywhere."""
    from hrl.runners.engines import engine_kind
    from hrl.runners.preflight import check_agent, check_sandbox, harnesses
    from hrl.runners.whitebox.harness import is_python_agent

    for agent in harnesses(settings):
        if not is_python_agent(agent):
            check_agent(agent)
    check_sandbox(settings.rollout.sandbox)
    engine_kind(settings.engine, settings.engine_options)


def _backend(device: str) -> str:
    return "gloo" if device == "cpu" else "nccl" if device.startswith("cuda") else "auto"


def _engine(settings: RunConfig, engine: str) -> dict[str, Any]:
    from hrl.runners.engines import engine_kind

    kind, options = engine_kind(engine, settings.engine_options)
    pcfg = settings.placement
    if pcfg.kind != "ray":
        return {"where": "driver", "replicas": 1, "engine": kind, "url": options.get("url"), "gpus_each": None,
                "cpus_each": None}  # fmt: skip
    return {"where": "ray", "replicas": pcfg.engine_replicas, "engine": kind, "url": options.get("url"),
            "gpus_each": pcfg.replica_gpus, "cpus_each": replica_cpus(pcfg)}  # fmt: skip


def _node_agents(settings: RunConfig, concurrency: int) -> dict[str, Any]:
    pcfg = settings.placement
    if pcfg.kind != "ray":
        return {"where": "driver", "count": 1, "episodes_per_node": concurrency}
    k = pcfg.episodes_per_node or (-(-concurrency // pcfg.nodes) if pcfg.nodes else None)
    return {"where": "ray", "count": pcfg.nodes or None, "episodes_per_node": k}


def _trainer(settings: RunConfig) -> dict[str, Any]:
    """The ranks and, on Ray, their placement group (`rank_bundles`)."""
    trainer, on_ray = settings.trainer, settings.placement.trainer == "ray"
    per = trainer.ranks_per_node if on_ray else 0
    bundles, _, strategy = rank_bundles(trainer.nproc, per)
    return {
        "where": "ray" if on_ray else "driver",
        "nproc": trainer.nproc,
        "ranks_per_node": per or None,
        "nodes": trainer.nproc // per if per else None,
        "bundles": bundles if on_ray else None,
        "strategy": strategy if on_ray else None,
        "device": trainer.device,
        "backend": _backend(trainer.device),
        "mode": trainer.mode,
    }


def _weights(settings: RunConfig) -> dict[str, Any]:
    """placement.weights on Ray; `local` where the engine is in this process (placement.weights is not read)."""
    mode = settings.placement.weights if settings.placement.kind == "ray" else "local"
    return {"mode": mode, "weight_sync": settings.engine_options.get("weight_sync")}


def plan(settings: RunConfig, model: str, engine: str, concurrency: int, *, training: bool = True) -> dict[str, Any]:
    """What `settings` would start where, as one JSON-able dict: the placement and cluster, the engine replicas, the
    node agents and their episodes at once, and (`training`) the trainer's ranks and how weights reach the replicas.
    `model` and `engine` are the run's after the flags, `concurrency` its episodes at once. A training plan refuses
    what `check_plan` refuses (a rollout has no trainer to place)."""
    if training:
        check_plan(settings)
    pcfg = settings.placement
    cluster = None
    if pcfg.kind == "ray":
        cluster = {"address": pcfg.address or None, "connect_timeout_s": pcfg.connect_timeout_s if pcfg.address
                   else None, "num_cpus": None if pcfg.address else (pcfg.num_cpus or None)}  # fmt: skip
    return {
        "placement": pcfg.kind,
        "cluster": cluster,
        "model": model,
        "engine": _engine(settings, engine),
        "node_agents": _node_agents(settings, concurrency),
        "concurrency": concurrency,
        "trainer": _trainer(settings) if training else None,
        "weights": _weights(settings) if training else None,
    }


def _cluster_line(p: dict[str, Any]) -> str:
    c = p["cluster"]
    if c is None:
        return "local: everything in this process, on this machine"
    if c["address"]:
        return f"ray, joining the cluster at {c['address']} (connect timeout {c['connect_timeout_s']:g} s)"
    cpus = f", {c['num_cpus']} CPUs" if c["num_cpus"] else ""
    return f"ray, on a local Ray cluster started here{cpus} (stopped at the end)"


def _engine_line(e: dict[str, Any]) -> str:
    at = f" at {e['url']}" if e["url"] else ""
    if e["where"] == "driver":
        return f"1 {e['engine']} engine{at}, in this process"
    if e["gpus_each"]:
        each = f"{e['gpus_each']:g} GPU + {e['cpus_each']:g} CPU each (a placement group each)"
    else:
        each = f"{e['cpus_each']:g} CPU each, no GPU" if e["cpus_each"] else "no CPU or GPU reserved for them"
    return f"{e['replicas']} {e['engine']} replica(s){at} as Ray actors, {each}"


def _agents_line(a: dict[str, Any], concurrency: int) -> str:
    """The node agents; `concurrency` bounds the episodes at once over all of them, whatever each node may run."""
    if a["where"] == "driver":
        return f"none: the proxy and the sandboxes run in this process, {a['episodes_per_node']} episodes at once"
    count = f"{a['count']} (placement.nodes), one per node" if a["count"] else "one per alive node (placement.nodes=0)"
    k = f"up to {a['episodes_per_node']} each" if a["episodes_per_node"] else f"⌈{concurrency} ÷ nodes⌉ each"
    return f"{count}, each with a proxy shard, Docker and sandboxes; {concurrency} episodes at once in all, {k}"


def _trainer_line(t: dict[str, Any]) -> str:
    ranks = f"{t['nproc']} FSDP2 ranks" if t["nproc"] > 1 else "1 rank"
    if t["where"] == "ray":
        per = (f"{t['ranks_per_node']} per node ({t['nodes']} nodes)" if t["ranks_per_node"]
               else "spread over the nodes as Ray can (trainer.ranks_per_node=0)")  # fmt: skip
        actors = "as Ray actors" if t["nproc"] > 1 else "as a Ray actor"
        group = f"a placement group of {t['bundles']} bundle(s), {t['strategy']}"
        where = f"{ranks} {actors} in {group}: {per}; the driver only orchestrates"
    elif t["nproc"] > 1:
        where = f"{ranks} on the driver: rank 0 in this process, the others spawned beside it"
    else:
        where = f"{ranks} in this process (the driver)"
    named = _BACKEND[t["where"]] if t["backend"] == "auto" else t["backend"]
    backend = f", backend {named}" if t["nproc"] > 1 else ""
    return f"{where}; device {t['device']}{backend}; {t['mode']}"


def _weights_line(w: dict[str, Any]) -> str:
    sync = f" (engine_options.weight_sync={w['weight_sync']})" if w["weight_sync"] else ""
    if w["mode"] == "local":
        return f"the engine in this process loads each published checkpoint{sync}"
    return f"{w['mode']}: {_WEIGHTS[w['mode']]}{sync}"


def describe(p: dict[str, Any]) -> str:
    """The plan as lines a person reads, one per piece, in the order the run starts them."""
    rows = [("placement", _cluster_line(p)), ("model", p["model"]), ("engine", _engine_line(p["engine"])),
            ("node agents", _agents_line(p["node_agents"], p["concurrency"]))]  # fmt: skip
    if p["trainer"] is not None:
        rows += [("trainer", _trainer_line(p["trainer"])), ("weights", _weights_line(p["weights"]))]
    if p.get("run_dir"):  # what `hrl train` adds to the plan
        rows.append(("run_dir", f"{p['run_dir']} ({'resumed' if p.get('resume') else 'new'})"))
    if p.get("out"):  # and `hrl rollout`
        rows.append(("traces", str(p["out"])))
    return "\n".join(f"{k.replace('_', ' '):<12}{v}" for k, v in rows)
