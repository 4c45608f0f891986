"""JSON on the proxy's hot paths (request bodies, SSE events, response bodies): orjson when it is installed (the
`fast` extra), else the standard library; every result is the same JSON value either way.

Only wire encoding goes through here. Whatever reaches the chat template or a trace (tool-call arguments, trace
lines) keeps the standard library's exact formatting: prompt ids must not depend on which library is installed.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["FAST", "dumps", "dumps_str", "loads"]

try:
    import orjson
except ImportError:  # pragma: no cover - the fallback is exercised where orjson is absent
    orjson = None  # type: ignore[assignment]

FAST = orjson is not None


def loads(data: bytes | str) -> Any:
    """Parse JSON. What orjson refuses but the standard library reads (NaN, integers over 64 bits, a UTF-16 body)
    is read by the standard library, so a request is accepted or refused, with the same message, either way."""
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


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
