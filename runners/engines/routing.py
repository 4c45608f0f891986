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

from hrl.config import RoutingConfig

__all__ = ["Router", "RoutingConfig", "hrw_rank"]

_HOMES = 100_000  # session homes remembered (least recently routed forgotten first: such a session is re-placed)


def _score(key: str, name: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{name}\0{key}".encode(), digest_size=8).digest(), "big")


def hrw_rank(key: str, names: list[str]) -> list[str]:
    """The replica names in rendezvous order for `key`: the first owns it, the next takes over if it is gone."""
    return sorted(names, key=lambda n: _score(key, n), reverse=True)


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
