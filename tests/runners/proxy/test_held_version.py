"""A session opened with a policy version (a held-out evaluation during async training) is served by that version
alone, under the `mixed` policy too, while newer LoRA versions are published; once the engine has evicted it, the
session's next call fails rather than mix versions."""

from __future__ import annotations

import httpx

from tests.proxy_helpers import running_proxy


def _ask(p, token: str, text: str) -> httpx.Response:
    """One call; each with its own text (the proxy takes a request repeated word for word as a retry)."""
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 4, "temperature": 1.0, "seed": 1}
    return httpx.post(f"{p.url}/s/{token}/v1/chat/completions", json=body, timeout=60)


def test_a_session_opened_with_a_version_keeps_it_until_evicted(tiny_model, tiny_lora):
    opts = {"dtype": "float32", "max_loaded_versions": 2}  # LoRA versions kept loaded: the live one and one before
    with running_proxy(tiny_model, engine="embedded", engine_options=opts, version_policy="mixed") as p:

        def publish() -> int:
            return p.call_async(p.proxy.publish, tiny_lora, "lora").result(60)

        assert publish() == 1
        p.call(p.proxy.open_session, "held", version=1)
        assert _ask(p, "held", "one").status_code == 200
        assert publish() == 2  # v1 still loaded beside v2
        assert _ask(p, "held", "two").status_code == 200 and _ask(p, "live", "two").status_code == 200
        assert publish() == 3  # v1 evicted: v2 and v3 are kept
        evicted = _ask(p, "held", "three")
        held, live = p.end("held"), p.end("live")
    assert evicted.status_code >= 500 and "no longer loaded" in evicted.text
    assert [c["versions"] for c in held["calls"] if c["response_ids"]] == [[[0, 1]], [[0, 1]]]  # never v2 or v3
    assert live["calls"][0]["versions"] == [[0, 2]]  # a session without a version follows the live policy
