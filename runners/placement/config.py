"""The recipe's `placement:` section: where a run's engine, proxy and agents stand."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = ["PlacementConfig"]


class PlacementConfig(BaseModel):
    """The recipe's `placement:` section (`--placement` sets `kind`)."""

    kind: Literal["local", "ray"] = Field("local", description="local: one process (today); ray: on a Ray cluster.")
    address: str = Field(
        "", description="Ray cluster to join (auto, ray://host:10001, host:6379); empty = start a local one."
    )
    engine_replicas: int = Field(1, ge=1, description="Engine servers (EngineReplica actors).")
    replica_gpus: float = Field(0, ge=0, description="GPUs per replica (its tensor-parallel size); 0 = CPU.")
    replica_cpus: float = Field(0, ge=0, description="CPUs Ray reserves per replica.")
    nodes: int = Field(0, ge=0, description="Node agents (one per node); 0 = one on every alive node.")
    episodes_per_node: int = Field(0, ge=0, description="K episodes at once per node; 0 = --concurrency spread.")
    num_cpus: int = Field(0, ge=0, description="CPUs of a local Ray started here; 0 = Ray's default.")
    routing: dict[str, Any] = Field(
        default_factory=dict,
        description="Each proxy shard's routing over the replicas (runners.proxy.routing.RoutingConfig: "
        "max_inflight, max_kv_cache_usage, max_waiting, poll_s, publish_retries).",
    )
