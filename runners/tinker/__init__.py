"""`hrl serve --tinker`: a Tinker-compatible training service (docs/tinker.md) over hrl's engine and trainer, for the
official `tinker` SDK (the `tinker` extra). Needs the SDK installed: its types and messages are the wire."""

from hrl.runners.tinker.serve import TinkerConfig, serve_tinker
from hrl.runners.tinker.service import LOSSES, LoraTrainer, TrainerFactory

__all__ = ["LOSSES", "LoraTrainer", "TinkerConfig", "TrainerFactory", "serve_tinker"]
