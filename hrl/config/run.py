"""`RunConfig`: a run's whole config, every section typed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hrl.config.distill import DistillConfig
from hrl.config.proxy import ProxyConfig
from hrl.config.rollout import RolloutConfig
from hrl.config.serving import OnlineConfig, PlacementConfig, TelemetryConfig
from hrl.config.train import AsyncConfig, LoopConfig, LoopSettings, TrainerConfig, check_batch_fits
from hrl.errors import UsageError

__all__ = ["DEFAULT_VERIFIER", "AsyncSection", "OnlineSection", "RunConfig"]

DEFAULT_VERIFIER = "tests"  # the `verifier:` section's `name` when it gives none: the task's own tests


def _section(ref: str, description: str, **extra: str) -> Any:
    """A recipe section checked against the model `ref` ("module:Class"; "engine" / "verifier": the config of
    the engine or verifier the recipe names); `extra` names keys the CLI itself reads there, with their type."""
    return Field(default_factory=dict, description=description, json_schema_extra={"model": ref, "extra": extra})


class AsyncSection(AsyncConfig):
    """The recipe's `async:` section: the asynchronous loop's settings and whether it runs."""

    enabled: bool = Field(False, description="Run the asynchronous loop (--async; --serve implies it).")


class OnlineSection(OnlineConfig):
    """The recipe's `online:` section: an online run's settings and whether the run is one."""

    enabled: bool = Field(False, description="Train on clients' sessions (--serve).")


class RunConfig(BaseModel):
    """A run's whole config: the recipe's keys after `-c` and the flags, as a run's config.json keeps them. The
    sections are typed here, each default written once in its model; engine_options and verifier belong to the
    engine and verifier they name (chosen by name at run time): those stay mappings, each naming its model
    ("engine" / "verifier": `hrl.runners.recipe_keys` checks a key against it; the component validates it when built)."""

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
    train: LoopSettings = Field(
        default_factory=LoopSettings, description="The outer loop: iterations, batch, advantage."
    )
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="The update: LoRA/full, lr, clipping.")
    distill: DistillConfig = Field(
        default_factory=DistillConfig,
        description="On-policy distillation: the teacher and its weight (off by default).",
    )
    async_: AsyncSection = Field(
        default_factory=AsyncSection, alias="async", description="The asynchronous loop (`enabled` turns it on)."
    )
    online: OnlineSection = Field(
        default_factory=OnlineSection,
        description="An online run's clients (`hrl train --serve` sets `enabled`): reward delay, late rewards, keys.",
    )
    placement: PlacementConfig = Field(default_factory=PlacementConfig, description="Where it runs: local, or Ray.")
    verifier: dict[str, Any] = _section("verifier", "The verifier (`name`) and its config.", name="str")
    telemetry: TelemetryConfig = Field(
        default_factory=TelemetryConfig, description="OpenTelemetry out: the OTLP endpoint (docs/telemetry.md)."
    )

    def loop(self) -> LoopConfig:
        """What the loops run with: `train` and `trainer` (the run's `model` trained), their cross-field rules
        checked together."""
        trainer = self.trainer.model_copy(update={"model": self.model}) if self.model else self.trainer
        return LoopConfig(**self.train.model_dump(exclude_unset=True), trainer=trainer, distill=self.distill)

    @model_validator(mode="after")
    def _loop_rules(self) -> RunConfig:
        """The loop's rules across `train` and `trainer` (train.advantage=dr_grpo with trainer.loss_norm, …)."""
        try:
            self.loop()
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return self

    @model_validator(mode="after")
    def _distill_on_own_episodes(self) -> RunConfig:
        """An online run's groups are its clients' and its advantages their rewards alone (`lone_advantages`): a
        teacher there is not supported yet, and `train.advantage: distill` would not be the teacher's signal alone."""
        if self.distill.enabled and self.serves_clients:
            raise UsageError(
                f"distill.teacher={self.distill.teacher} is not supported with --serve yet: an online run's "
                "advantages are its clients' rewards alone",
                hint="distill in hrl train's own loops (sync or --async), or leave distill.teacher out",
            )
        return self

    @model_validator(mode="after")
    def _pin_needs_adapters(self) -> RunConfig:
        """A full publish replaces the only weights the engine holds: a pinned trace would silently go on as mixed."""
        if self.proxy.version_policy == "pin" and self.trainer.mode == "full":
            raise UsageError(
                "proxy.version_policy=pin keeps an episode on the version it started with, but trainer.mode=full "
                "publishes replace the engine's only weights: pinned episodes would silently continue as mixed",
                hint="use -c proxy.version_policy=mixed with --full, or train LoRA adapters (--lora) to pin",
            )
        return self

    @model_validator(mode="after")
    def _async_loop_can_run(self) -> RunConfig:
        """The async buffer holds a batch (`check_batch_fits`), and no engine is asked to sleep in a loop that never
        puts it to sleep."""
        if not self.async_.enabled:
            return self
        check_batch_fits(self.async_, self.train.group_size)
        if level := int(self.engine_options.get("sleep_level") or 0):
            raise UsageError(
                f"engine_options.sleep_level={level} puts vLLM to sleep around each update of the synchronous loop, "
                "but the async loop (--async, --serve) serves while it trains and never sleeps or wakes the engine: "
                "the trainer would be built beside an engine holding its whole memory share",
                hint="use -c engine_options.sleep_level=0 with --async or --serve and give the engine and the "
                "trainer their own GPUs (engine_options.gpus, trainer.gpus), or train without --async",
            )
        return self

    @model_validator(mode="after")
    def _turn_credit_scores_turns(self) -> RunConfig:
        """`train.credit: turn` trains on scores the rollouts record (`rollout.turn_scores`); an online run's
        episodes are its clients', with no sandbox of hrl's to score."""
        if self.train.credit != "turn":
            return self
        if self.serves_clients:
            raise UsageError(
                "train.credit=turn scores each turn in the episode's sandbox, but an online run's (--serve) episodes "
                "are its clients', with no sandbox hrl can score",
                hint="use -c train.credit=episode with --serve",
            )
        self.rollout.turn_scores = True
        return self

    @property
    def serves_clients(self) -> bool:
        """An online run (`hrl train --serve`): episodes come from clients."""
        return self.online.enabled

    @property
    def verifier_name(self) -> str:
        """The verifier the `verifier:` section names (`name`), else the task's tests."""
        return str(self.verifier.get("name") or DEFAULT_VERIFIER)

    def for_training(self) -> RunConfig:
        """As `hrl train` runs it: every call sampled honestly (`proxy.sampling: honest`, whatever a run written
        before said), so the recorded logprobs are those of the distribution the tokens were drawn from."""
        self.proxy.sampling = "honest"
        return self

    def dump(self) -> dict[str, Any]:
        """The config as a run's config.json keeps it: what was given or set, by the names a recipe uses."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)

    def proxy_options(self) -> dict[str, Any]:
        """The proxy settings the recipe gave (the proxy's own defaults fill the rest)."""
        return self.proxy.model_dump(exclude_unset=True)
