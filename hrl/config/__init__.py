"""A run's config, typed: every section of a recipe as a pydantic model, each default written once, the rules across
fields as validators on the models. The lowest room of hrl beside hrl.errors: every layer may import it, and it
imports nothing heavy (pydantic only), so a refused `-c` or recipe is said before anything else is imported."""

from hrl.config.distill import DistillConfig
from hrl.config.proxy import BYTES_PER_TOKEN, MediaPolicy, ProxyConfig
from hrl.config.rollout import PROXY_PORT, RolloutConfig
from hrl.config.run import DEFAULT_VERIFIER, AsyncSection, OnlineSection, RunConfig
from hrl.config.serving import OnlineConfig, PlacementConfig, RoutingConfig, TelemetryConfig
from hrl.config.train import (
    AdvantageKind,
    AsyncConfig,
    LoopConfig,
    LoopSettings,
    SamplerKind,
    TrainerConfig,
    check_batch_fits,
)

__all__ = [
    "BYTES_PER_TOKEN",
    "DEFAULT_VERIFIER",
    "PROXY_PORT",
    "AdvantageKind",
    "AsyncConfig",
    "AsyncSection",
    "DistillConfig",
    "LoopConfig",
    "LoopSettings",
    "MediaPolicy",
    "OnlineConfig",
    "OnlineSection",
    "PlacementConfig",
    "ProxyConfig",
    "RolloutConfig",
    "RoutingConfig",
    "RunConfig",
    "SamplerKind",
    "TelemetryConfig",
    "TrainerConfig",
    "check_batch_fits",
]
