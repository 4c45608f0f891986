"""Which proxy worker owns a session token: rendezvous hashing over the workers, as sessions are placed on engine
replicas, so every worker and every client agree without asking one another."""

from __future__ import annotations

import secrets

from hrl.runners.engines.replicas import hrw_rank

__all__ = ["owned_token", "owner"]


def owner(token: str, workers: int) -> int:
    """The worker (0 … workers-1) a session token belongs to: rendezvous hashing, as engine replicas are placed
    (`runners.proxy.routing`), so a pool that grows by one worker moves about 1/N of the tokens."""
    if workers <= 1:
        return 0
    return int(hrw_rank(token, [str(i) for i in range(workers)])[0])


def owned_token(index: int, workers: int) -> str:
    """A fresh 128-bit token that worker `index` owns (about `workers` draws)."""
    while True:
        token = secrets.token_urlsafe(16)
        if owner(token, workers) == index:
            return token
