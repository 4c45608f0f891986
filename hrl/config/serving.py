"""The sections of a recipe that say where and how a run is served: `placement:` (local or Ray, with each proxy
shard's `routing`), `online:` (clients' sessions) and `telemetry:` (OTLP out)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["OnlineConfig", "PlacementConfig", "RoutingConfig", "TelemetryConfig"]


class RoutingConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)  # no bound holds inf or nan

    policy: Literal["cache_aware", "hrw", "round_robin"] = Field(
        "cache_aware",
        description="cache_aware: a session stays on the replica it was first placed on (the least loaded) until "
        "that replica's load exceeds the least-loaded one's by more than move_threshold, then moves; hrw: a session "
        "sticks to its rendezvous-hash replica whatever its load; round_robin: each generation goes to the next "
        "replica (for comparison; sessions do not stick).",
    )
    move_threshold: int = Field(
        4,
        ge=0,
        description="cache_aware: how many more requests (in flight from this proxy, plus running or waiting on the "
        "engine from elsewhere) a session's replica may hold than the least-loaded one before the session moves; "
        "0 = move whenever another replica is less loaded.",
    )
    load_factor: float = Field(
        0.0,
        ge=0,
        description="hrw with bounded loads: a generation whose replica already has more than load_factor × the "
        "mean load goes to the next replica in its HRW order (e.g. 1.25); 0 = always the owner.",
    )
    max_inflight: int = Field(0, ge=0, description="Most generations in flight per replica; 0 = no ceiling.")
    max_kv_cache_usage: float = Field(
        0.95, ge=0, le=1, description="vLLM replicas: admit while their KV-cache use (from /metrics) is below this."
    )
    max_waiting: int = Field(
        0, ge=0, description="vLLM replicas: admit while fewer requests than this wait in their queue; 0 = any."
    )
    poll_s: float = Field(1.0, gt=0, description="How often replicas' health (and vLLM's /metrics) is read.")
    publish_retries: int = Field(2, ge=0, description="Retries of a replica's failed pause / publish / resume.")


class PlacementConfig(BaseModel):
    """The recipe's `placement:` section (`--placement` sets `kind`)."""

    model_config = ConfigDict(allow_inf_nan=False)  # no bound holds inf or nan

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
    connect_timeout_s: float = Field(
        60, gt=0, description="Seconds to join the cluster at `address`; one that does not answer by then is an error."
    )
    trainer: Literal["driver", "ray"] = Field(
        "driver",
        description="Where the trainer's ranks run: driver (in the hrl process and its children, on this node) or ray "
        "(each of the trainer.nproc ranks a Ray actor in a placement group over the cluster's nodes, "
        "trainer.ranks_per_node each; the driver only orchestrates).",
    )
    weights: Literal["auto", "ship", "disk"] = Field(
        "auto",
        description="How a published checkpoint reaches the replicas: disk (each reads the run directory's path: one "
        "node or a shared file system), ship (sent through Ray's object store and written on the replica's node, "
        "checked by sha256 and version) or auto (ship when a replica runs on another node than the driver).",
    )

    @model_validator(mode="after")
    def _ray_trainer_on_ray(self) -> PlacementConfig:
        if self.trainer == "ray" and self.kind != "ray":
            raise ValueError("placement.trainer=ray places the trainer's ranks on a Ray cluster: add --placement ray")
        return self

    routing: dict[str, Any] = Field(
        default_factory=dict,
        description="Each proxy shard's routing over the replicas (runners.engines.replicas.RoutingConfig: "
        "max_inflight, max_kv_cache_usage, max_waiting, poll_s, publish_retries).",
    )


class OnlineConfig(BaseModel):
    """The recipe's `online:` section, read by `hrl train --serve`."""

    model_config = ConfigDict(allow_inf_nan=False)  # no bound holds inf or nan

    max_reward_delay_s: float = Field(
        600, gt=0, description="Seconds after a session's end that a reward is on time (else late_reward applies)."
    )
    late_reward: Literal["drop", "off_policy"] = Field(
        "drop",
        description="A reward past max_reward_delay_s, or for a trace staler than async.max_staleness: drop "
        "(recorded, counted as online/late_rewards, not trained) or off_policy (trained with the loop's bounded "
        "importance weights, without the staleness filter; counted too).",
    )
    session_timeout_s: float = Field(
        900, gt=0, description="A session with no request for this long is reaped: recorded, never trained."
    )
    scorer: str = Field(
        "", description="python:MODULE:FUNCTION | FILE.py:FUNCTION scoring a session ended without a reward: "
        "f(trace, info) -> reward, (reward, info), or None (cannot say: the trace waits for POST "
        "/s/<token>/reward, as every such trace does with '')."
    )  # fmt: skip
    keys_file: str = Field("", description="The client keys file; '' = <run>/client_keys.json (hrl keys add).")
    max_open_per_key: int = Field(256, ge=1, description="Open sessions one client key may hold at once (429 past).")
    baseline: Literal["batch", "task"] = Field(
        "task",
        description="Advantage of a trace without a group in its batch: task = r − the running mean reward of its "
        "task_id once seen 4 times, else as batch; batch = (r − mean) / std over the batch's lone traces. task "
        "correlates better with r − p (the ideal) when tasks recur, and no worse when they do not "
        "(bench/online_baseline.py, docs/online.md).",
    )


class TelemetryConfig(BaseModel):
    """The recipe's `telemetry:` section (`--otlp URL` sets `otlp_endpoint`)."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    otlp_endpoint: str = Field(
        "",
        description="OTLP/HTTP collector base URL (http://host:4318; /v1/traces is added); empty = "
        "$OTEL_EXPORTER_OTLP_ENDPOINT, and with that unset nothing is exported.",
    )
    service_name: str = Field("hrl", description="The `service.name` resource attribute.")
    export_timeout_s: float = Field(5.0, gt=0, description="Seconds one export request may take.")
