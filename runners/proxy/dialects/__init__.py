"""Agent wire formats the proxy speaks, by name (the name is recorded as each call's `dialect`)."""

from __future__ import annotations

import importlib
from typing import Any

from hrl.runners.proxy.dialects.base import (
    BadRequestError,
    ChatRequest,
    ChatResult,
    Dialect,
    StreamEncoder,
    check_request,
)

__all__ = [
    "DIALECTS",
    "BadRequestError",
    "ChatRequest",
    "ChatResult",
    "Dialect",
    "StreamEncoder",
    "check_request",
    "get_dialect",
]

DIALECTS: dict[str, str] = {
    "chat": "hrl.runners.proxy.dialects.chat:ChatDialect",
    "responses": "hrl.runners.proxy.dialects.responses:ResponsesDialect",
    "anthropic": "hrl.runners.proxy.dialects.anthropic:AnthropicDialect",
    "gemini": "hrl.runners.proxy.dialects.gemini:GeminiDialect",
}
_cache: dict[str, Any] = {}


def get_dialect(name: str) -> Dialect:
    if name not in _cache:
        module, _, attr = DIALECTS[name].partition(":")
        _cache[name] = getattr(importlib.import_module(module), attr)()
    return _cache[name]  # type: ignore[no-any-return]
