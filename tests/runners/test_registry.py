"""Every plug-in registry fails an unknown name the same way: one UnknownNameError (an HrlError and a KeyError)
that lists the valid names, raised before anything is imported."""

from __future__ import annotations

import pytest

import hrl.errors
import hrl.runners.errors
from hrl.errors import HrlError, UnknownNameError
from hrl.registry import lookup
from hrl.runners.agents import get_agent
from hrl.runners.engines import engine_kind, make_engine
from hrl.runners.proxy.dialects import get_dialect
from hrl.runners.tasks import make_verifier
from hrl.sandboxes import SandboxError, SandboxUnavailableError, get_backend

LOOKUPS = [
    (lambda: get_backend("nope"), "unknown sandbox 'nope'; valid: docker, local"),
    (
        lambda: make_engine("nope", "m"),
        "unknown engine 'nope'; valid: embedded, remote, replicas, scripted, vllm or an http:// URL",
    ),
    (lambda: engine_kind("nope"), "unknown engine 'nope'"),
    (lambda: get_agent("nope"), "unknown agent 'nope'; valid: aider, browser-use, claude-code,"),
    (
        lambda: make_verifier("nope", get_backend("local")),
        "unknown verifier 'nope'; valid: harbor, miniwob, tests or python, with a Python agent only (white-box recipes)",
    ),
    (lambda: get_dialect("nope"), "unknown dialect 'nope'; valid: anthropic, chat, gemini, responses"),
]


@pytest.mark.parametrize(("call", "message"), LOOKUPS)
def test_every_registry_raises_one_error_type_listing_the_valid_names(call, message):
    with pytest.raises(UnknownNameError) as info:
        call()
    assert str(info.value).startswith(message)
    assert isinstance(info.value, HrlError) and isinstance(info.value, KeyError)


def test_the_error_classes_are_one_class_each_across_layers():
    assert hrl.runners.errors.UnknownNameError is hrl.errors.UnknownNameError
    assert hrl.runners.errors.HrlError is hrl.errors.HrlError
    assert issubclass(SandboxError, HrlError) and issubclass(SandboxUnavailableError, SandboxError)


def test_lookup_imports_only_the_entry_asked_for():
    registry = {"path": "os.path:join", "broken": "no.such.module:X"}
    assert lookup(registry, "thing", "path")("a", "b") == "a/b"
    with pytest.raises(UnknownNameError, match="valid: broken, path"):
        lookup(registry, "thing", "other")


def test_an_agents_dialect_name_is_a_dialect_the_proxy_speaks():
    from typing import get_args

    from hrl.runners.agents.base import DialectName
    from hrl.runners.proxy.dialects import DIALECTS

    assert set(get_args(DialectName)) == set(DIALECTS)
