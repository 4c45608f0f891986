"""The vLLM contract read from a server's /version and OpenAPI schema (runners/engines/vllm_contract.py): versions,
routes, the pause modes, and the refusals. The pinned server's own schema is checked in test_vllm.py."""

from __future__ import annotations

import pytest

from hrl.runners.engines.vllm_contract import FULL_PUBLISH, LORA_PUBLISH, Contract, contract_from, parse_version
from hrl.runners.errors import EngineError, EngineStartError


def _schema(paths: list[str], pause_modes: list[str] | None = ("abort", "wait", "keep"), reset_running=True) -> dict:
    out: dict = {"paths": {p: {"post": {"parameters": []}} for p in paths}, "components": {"schemas": {}}}
    if "/pause" in paths and pause_modes is not None:  # FastAPI writes a Literal query parameter as a $ref'd enum
        out["components"]["schemas"]["PauseMode"] = {"type": "string", "enum": list(pause_modes)}
        mode = {"name": "mode", "in": "query", "schema": {"$ref": "#/components/schemas/PauseMode", "default": "abort"}}
        out["paths"]["/pause"]["post"]["parameters"] = [mode]
    if "/reset_prefix_cache" in paths and reset_running:
        param = {"name": "reset_running_requests", "in": "query", "schema": {"type": "boolean"}}
        out["paths"]["/reset_prefix_cache"]["post"]["parameters"] = [param]
    return out


@pytest.mark.parametrize(
    ("text", "want"),
    [("0.32.0", (0, 32, 0)), ("0.16.1rc2.dev13+g1234", (0, 16, 1)), ("0.11.0+cpu", (0, 11, 0)), ("1.2", (1, 2, 0))],
)
def test_versions(text, want):
    assert parse_version(text) == want


def test_unreadable_version_is_refused():
    with pytest.raises(EngineStartError, match="cannot read"):
        parse_version("main")


def test_a_full_schema_serves_every_publish():
    c = contract_from("0.32.0", _schema([*FULL_PUBLISH, *LORA_PUBLISH]))
    c.check_floor()
    assert c.missing(FULL_PUBLISH + LORA_PUBLISH) == []
    c.require("a full publish", FULL_PUBLISH)


def test_too_old_a_server_is_refused_with_one_hint():
    with pytest.raises(EngineStartError) as e:
        Contract("0.15.1").check_floor()
    assert "0.15.1 is older than the oldest version hrl supports (0.16.0)" in str(e.value)
    assert e.value.hint and "VLLM_SERVER_DEV_MODE=1" in e.value.hint


def test_missing_routes_and_options_are_named():
    no_dev = contract_from("0.32.0", _schema(["/v1/completions", "/health"]))
    with pytest.raises(EngineStartError, match=r"does not serve /pause, /resume, /collective_rpc"):
        no_dev.require("a full publish", FULL_PUBLISH)
    old_pause = contract_from("0.20.0", _schema(list(FULL_PUBLISH), pause_modes=["abort", "wait"], reset_running=False))
    assert old_pause.missing(FULL_PUBLISH) == ["/pause?mode=keep", "/reset_prefix_cache?reset_running_requests=true"]
    with pytest.raises(EngineError) as e:  # at publish time: the same message, as a run-time error
        old_pause.require("a full publish", FULL_PUBLISH, at_start=False)
    assert not isinstance(e.value, EngineStartError)


def test_without_a_schema_only_the_floor_is_checked():
    c = contract_from("0.32.0", None)
    assert c.routes is None and c.missing(FULL_PUBLISH) == [] and c.ipc_phases == 4


def test_weight_transfer_phases():
    four = ["/init_weight_transfer_engine", "/start_weight_update", "/update_weights", "/finish_weight_update"]
    assert contract_from("0.32.0", _schema(four)).ipc_phases == 4
    assert contract_from("0.32.0", _schema(four)).ipc_init_info() == {"packed": False}
    two = contract_from("0.20.0", _schema(["/init_weight_transfer_engine", "/update_weights"]))
    assert two.ipc_phases == 2 and two.ipc_init_info() == {}
    assert contract_from("0.20.0", _schema([])).ipc_phases == 0
