"""A run's config (`RunConfig`: the resolved recipe a run stands up from) and its `placement:` section."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hrl.runners.proxy.proxy import ProxyConfig
from hrl.runners.rollout import RolloutConfig
from hrl.runners.telemetry.otlp import TelemetryConfig

__all__ = ["PlacementConfig", "RunConfig"]


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
    routing: dict[str, Any] = Field(
        default_factory=dict,
        description="Each proxy shard's routing over the replicas (runners.engines.replicas.RoutingConfig: "
        "max_inflight, max_kv_cache_usage, max_waiting, poll_s, publish_retries).",
    )


def _section(ref: str, description: str, **extra: str) -> Any:
    """A recipe section checked against the model `ref` ("module:Class"; "engine" / "verifier": the config of
    the engine or verifier the recipe names); `extra` names keys the CLI itself reads there, with their type."""
    return Field(default_factory=dict, description=description, json_schema_extra={"model": ref, "extra": extra})


class RunConfig(BaseModel):
    """A run's whole config: the recipe's keys after `-c` and the flags, as a run's config.json keeps them. The
    sections hrl.runners reads are typed here (rollout, proxy, placement); engine_options and verifier belong to
    the engine and verifier they name, and train, trainer and async to hrl.train: those stay mappings, each naming
    its model ("module:Class", `hrl.cli.keys` checks a key against it; the component validates it when built)."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", populate_by_name=True)

    name: str = Field("", description="The recipe's name (default: its folder's).")
    description: str = Field("", description="One line for `hrl recipes ls`.")
    recipe_dir: str = Field("", description="Set by the loader: the folder relative paths are resolved against.")
    recipe: str = Field("", description="Set by `hrl train`: the recipe name or path the run was made from.")
    model: str = Field("", description="HF model id, local dir, LoRA checkpoint, or hrl:tiny / hrl:tiny-agent.")
    engine: str = Field("embedded", description="embedded | vllm | URL of a running vLLM server.")
    tasks: str = Field("", description="Task file (SWE-bench JSONL, JSON or Parquet), relative to the recipe.")
    eval_tasks: str = Field("", description="Held-out task file, never trained on.")
    max_error_rate: float = Field(
        0.25, ge=0, le=1, description="`hrl rollout` exits 3 above this share of infra failures."
    )
    engine_options: dict[str, Any] = _section("engine", "Options of the engine's config (EmbeddedEngineConfig, …).")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Agent, sandbox, time budget.")
    proxy: ProxyConfig = Field(default_factory=ProxyConfig, description="The recording proxy.")
    train: dict[str, Any] = _section(
        "hrl.train.loop_config:LoopConfig", "The outer loop: iterations, batch, advantage."
    )
    trainer: dict[str, Any] = _section("hrl.train.trainer_config:TrainerConfig", "The update: LoRA/full, lr, clipping.")
    async_: dict[str, Any] = Field(
        default_factory=dict,
        alias="async",
        description="The asynchronous loop (`enabled` turns it on).",
        json_schema_extra={"model": "hrl.train.async_config:AsyncConfig", "extra": {"enabled": "bool"}},
    )
    online: dict[str, Any] = Field(
        default_factory=dict,
        description="An online run's clients (`hrl train --serve` sets `enabled`): reward delay, late rewards, keys.",
        json_schema_extra={"model": "hrl.runners.online.sessions:OnlineConfig", "extra": {"enabled": "bool"}},
    )
    placement: PlacementConfig = Field(default_factory=PlacementConfig, description="Where it runs: local, or Ray.")
    verifier: dict[str, Any] = _section("verifier", "The verifier (`name`) and its config.", name="str")
    telemetry: TelemetryConfig = Field(
        default_factory=TelemetryConfig, description="OpenTelemetry out: the OTLP endpoint (docs/telemetry.md)."
    )

    def proxy_options(self) -> dict[str, Any]:
        """The proxy settings the recipe gave (the proxy's own defaults fill the rest)."""
        return self.proxy.model_dump(exclude_unset=True)
