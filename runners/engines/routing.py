"""Where a generation goes among engine replicas: the routing policies of a `ReplicaSet` (`replicas.py`).

- `cache_aware` (the default): a session stays on its home replica, where it was first placed (the least-loaded
  usable replica, ties broken by HRW so every proxy shard places alike), while the home's load exceeds the
  least-loaded replica's by at most `move_threshold`; past that its next generation moves to the least-loaded one,
  which becomes its home. Its prefix cache stays warm while that costs little, and a saturated replica sheds
  sessions instead of queueing them (pure hash pinning thrashes a saturated replica's cache).
- `hrw`: the session's rendezvous-hash owner, always (with `load_factor`, bounded loads: the next in HRW order
  takes a generation when the owner is over that factor × the mean).
- `round_robin`: each generation to the next replica (for comparison; sessions do not stick).

A replica's load is the generations this router has in flight on it plus the requests its engine reported running
or waiting beyond those at the last poll (another shard's requests, on a shared vLLM server).
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Router", "RoutingConfig", "hrw_rank"]

_HOMES = 100_000  # session homes remembered (least recently routed forgotten first: such a session is re-placed)


def _score(key: str, name: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{name}\0{key}".encode(), digest_size=8).digest(), "big")


def hrw_rank(key: str, names: list[str]) -> list[str]:
    """The replica names in rendezvous order for `key`: the first owns it, the next takes over if it is gone."""
    return sorted(names, key=lambda n: _score(key, n), reverse=True)


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


class Router:
    """The policy's choice (`pick`, no side effects, so a request that waits for its replica's budget can ask
    again) and what an admitted generation changes (`placed`: a cache_aware session's home, the moves)."""

    def __init__(self, config: RoutingConfig) -> None:
        self.config = config
        self._turn = -1  # round_robin's last pick
        self._homes: OrderedDict[str, str] = OrderedDict()  # cache_aware: session key -> its home replica
        self.moves = 0  # cache_aware sessions moved off a replica over the threshold
        self.rehomes = 0  # cache_aware sessions re-placed because their home was gone (dead, fenced)

    def pick(self, key: str, loads: dict[str, int]) -> str | None:
        """The replica for the session `key`'s next generation among the usable ones (`loads`: name -> load)."""
        if not loads:
            return None
        if self.config.policy == "round_robin":
            names = list(loads)
            return names[(self._turn + 1) % len(names)]
        if self.config.policy == "cache_aware":
            home = self._homes.get(key)
            if home in loads and loads[home] - min(loads.values()) <= self.config.move_threshold:
                return home
            return least_loaded(key, loads)
        ranked = hrw_rank(key, list(loads))
        if self.config.load_factor > 0 and len(ranked) > 1:
            cap = max(1, math.ceil(self.config.load_factor * (sum(loads.values()) + 1) / len(ranked)))
            return next((n for n in ranked if loads[n] < cap), ranked[0])
        return ranked[0]

    def placed(self, key: str, name: str, loads: dict[str, int]) -> str | None:
        """Note that `key`'s generation was admitted on `name`; the replica it moved from for load, if it did."""
        if self.config.policy == "round_robin":
            self._turn = (self._turn + 1) % len(loads)
        if self.config.policy != "cache_aware":
            return None
        home = self._homes.pop(key, None)
        self._homes[key] = name
        if len(self._homes) > _HOMES:
            self._homes.popitem(last=False)
        if home is None or home == name:
            return None
        if home not in loads:
            self.rehomes += 1
            return None
        self.moves += 1
        return home


def least_loaded(key: str, loads: dict[str, int]) -> str:
    """The least-loaded replica; among equals the first in `key`'s HRW order (every shard places alike)."""
    least = min(loads.values())
    return hrw_rank(key, [n for n, load in loads.items() if load == least])[0]
