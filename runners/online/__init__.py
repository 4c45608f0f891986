"""Online RL: hrl as a training service for agents that run anywhere (`hrl train --serve`, docs/online.md).

`ClientKeys` (who may open sessions), `OnlineSessions` (a client's sessions, their rewards however late, and the
traces they become), `OnlineConfig` (the recipe's `online:` section)."""

from hrl.runners.online.keys import ClientKeys, add_key
from hrl.runners.online.sessions import OnlineConfig, OnlineSessions

__all__ = ["ClientKeys", "OnlineConfig", "OnlineSessions", "add_key"]
