"""The demo-model wing: tiny models built offline, for tests, the CPU demo and trying a harness with no model hub.

`model` builds a tiny random chat model (`hrl models tiny`), `vision` its vision-language sibling (`--vision`),
`agent` the CPU demo's warm-started agent model (`hrl models tiny-agent`) from `transcripts` of the demo's `tasks`
in the harness's `profile`; `chatml` is their chat template. The wing enters `runners` only through public names; the RL core of `train` never imports it.
"""

from hrl.train.tiny.agent import (
    BUILD_INFO,
    TinyAgentConfig,
    build_info,
    build_tiny_agent,
    shipped_model,
)
from hrl.train.tiny.build import verify_text
from hrl.train.tiny.model import TinyModelConfig, build_tiny_model
from hrl.train.tiny.verify import verify_build
from hrl.train.tiny.vision import TinyVisionConfig, build_tiny_vision_model

__all__ = [
    "BUILD_INFO",
    "TinyAgentConfig",
    "TinyModelConfig",
    "TinyVisionConfig",
    "build_info",
    "build_tiny_agent",
    "build_tiny_model",
    "build_tiny_vision_model",
    "shipped_model",
    "verify_build",
    "verify_text",
]
