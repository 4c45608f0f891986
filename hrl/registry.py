"""One lazy registry per plug-in axis: a dict from name to "module:Attr", imported only when asked for.

Every registry (sandboxes, engines, agents, verifiers, proxy dialects) looks names up here, so an unknown name
fails the same way everywhere: `UnknownNameError` listing the valid names.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from typing import Any

from hrl.errors import UnknownNameError

__all__ = ["load", "lookup", "require"]


def require(registry: Mapping[str, str], kind: str, name: str, *, also: str = "") -> str:
    """The "module:Attr" registered under `name`, without importing it; raises UnknownNameError listing the valid
    names (`also` describes any other accepted form, e.g. "an http:// URL")."""
    if name not in registry:
        valid = ", ".join(sorted(registry)) + (f" or {also}" if also else "")
        near = difflib.get_close_matches(name, list(registry), n=1)
        guess = f" (did you mean {near[0]!r}?)" if near else ""
        raise UnknownNameError(f"unknown {kind} {name!r}{guess}; valid: {valid}")
    return registry[name]


def load(ref: str) -> Any:
    """Import "module:Attr" and return the attribute."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def lookup(registry: Mapping[str, str], kind: str, name: str, *, also: str = "") -> Any:
    """The attribute registered under `name` (usually a class), imported now; see `require` for unknown names."""
    return load(require(registry, kind, name, also=also))
