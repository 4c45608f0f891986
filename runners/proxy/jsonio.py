"""JSON the proxy writes on its hot paths (SSE events, response bodies): orjson when it is installed (the `fast`
extra), else the standard library; the same JSON value either way.

Only encoding goes through here. Request bodies are read by the standard library: orjson reads integers past 64
bits as floats, which would change a tool call's arguments and so the prompt ids (and reading is once per call,
a small share of the serving process in the profiles: docs/proxy.md, "Speed"). Whatever reaches the chat template or a trace keeps the
standard library's formatting too: prompt ids must not depend on which library is installed.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["FAST", "dumps", "dumps_str"]

try:
    import orjson
except ImportError:  # pragma: no cover - the fallback is exercised where orjson is absent
    orjson = None  # type: ignore[assignment]

FAST = orjson is not None


def dumps(obj: Any) -> bytes:
    """Compact JSON as UTF-8 bytes (non-ASCII text unescaped)."""
    if orjson is not None:
        try:
            return orjson.dumps(obj)
        except TypeError:  # e.g. an integer over 64 bits, a non-string key
            pass
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def dumps_str(obj: Any) -> str:
    return dumps(obj).decode()
