"""The event loop the proxy serves on: uvloop when it is installed (the `fast` extra) and `HRL_UVLOOP` is not 0,
else asyncio's own. uvloop's transports write and schedule in C: the proxy's per-token socket writes and timers
cost less (bench/results/ has the profiles)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run", "uvloop_enabled"]

T = TypeVar("T")


def uvloop_enabled() -> bool:
    if os.environ.get("HRL_UVLOOP", "1") == "0":
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, on uvloop when it is enabled."""
    if uvloop_enabled():
        import uvloop

        return uvloop.run(main)  # type: ignore[no-any-return]
    return asyncio.run(main)
