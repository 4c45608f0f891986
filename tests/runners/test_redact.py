"""The redactor keeps host secrets out of traces: planted env secrets and known key formats are replaced, ordinary
words, identifiers, paths, numbers and hrl's own session keys are not; the trace writer applies it to every text
field and to nothing that carries token ids."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hrl.runners.redact import LONG_TEXT, Redactor, is_secret_name
from hrl.runners.trace import TraceWriter, encode_trace, read_traces, redact_trace

ENV = {
    "OPENAI_API_KEY": "sk-proj-Zq3xV8mN1bT6yR4wK9pL2sD7fG5hJ0cA",
    "HRL_TEST_SECRET_TOKEN": "tok-8f1c2e9a7b3d4c5e",
    "PGPASSWORD": "correct-horse-battery",
    "AWS_SESSION_TOKEN": "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQ",
    "GITHUB_PAT": "hunter2hunter2",
    # not secrets: a path, a list of paths, a boolean, a number, too short, hrl's own key, not a secret name
    "GOOGLE_APPLICATION_CREDENTIALS": "/etc/gcloud/creds.json",
    "SSH_AUTH_SOCK": "/tmp/ssh-XXXX/agent.123",
    "KEY_PATHS": "/a/b:/c/d:~/e",
    "TOKENIZERS_PARALLELISM": "false",
    "SESSION_TIMEOUT": "86400000",
    "API_KEY_SHORT": "abc",
    "OPENAI_API_KEY_FOR_TESTS": "hrl-Zq3xV8mN1bT6yR4w",
    "KEYBOARD_LAYOUT": "dvorak-programmer",
    "HOME": "/root",
}
KEYS = {  # kind -> a token of that format
    "openai-key": "sk-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z",
    "anthropic-key": "sk-ant-api03-Xy4zAb3dEf6hIj9kLm2nOp5qRs8tUv1w",
    "huggingface-token": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567",
    "aws-access-key-id": "AKIAIOSFODNN7EXAMPLE",
    "github-token": "ghp_" + "a1B2" * 9,
    "slack-token": "xoxb-123456789012-abcdefABCDEF",
    "google-api-key": "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
}
PEM = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\nQyNTUxOQAAACB\n-----END OPENSSH PRIVATE KEY-----"
ORDINARY = (
    "def hf_hub_download(task-abcdefghijklmnopqrstuvwxyz1, sk-learn): return ASIAN_MARKET + disk-usage-report  "
    "see https://example.com:8080/path@v2 and git@github.com:owner/repo.git; Bearer short; bearer hrl-aSessionTokenABCD"
)


@pytest.fixture
def red() -> Redactor:
    return Redactor.from_env(ENV)


def test_secret_names() -> None:
    secret = ["OPENAI_API_KEY", "HF_TOKEN", "PGPASSWORD", "AWS_SECRET_ACCESS_KEY", "GITHUB_PAT", "npm_config__auth",
              "MY_COOKIES", "DB_PASSWD", "GCP_CREDENTIALS", "PRIVATE_KEY", "APIKEY", "MYSQL_PASS", "hf_token"]  # fmt: skip
    plain = ["PATH", "KEYBOARD_LAYOUT", "TOKENIZERS_PARALLELISM", "GIT_AUTHOR_NAME", "XAUTHORITY", "SSH_AUTH_SOCK",
             "PATTERN", "PASSAGE", "COMPILER"]  # fmt: skip
    assert [n for n in secret if not is_secret_name(n)] == []
    assert [n for n in plain if is_secret_name(n)] == []


def test_from_env_collects_only_secret_values(red: Redactor) -> None:
    assert red.names == ("AWS_SESSION_TOKEN", "GITHUB_PAT", "HRL_TEST_SECRET_TOKEN", "OPENAI_API_KEY", "PGPASSWORD")


@pytest.mark.parametrize("pad", [0, LONG_TEXT], ids=["short", "long"])  # both code paths: one regex / substrings
def test_planted_env_secrets_are_replaced_by_name(red: Redactor, pad: int) -> None:
    filler = "x = 1\n" * (pad // 6)
    text = filler + " ".join(f"{k}={v}" for k, v in ENV.items()) + " again:" + ENV["PGPASSWORD"] + filler
    out = red.text(text)
    for name in red.names:
        assert ENV[name] not in out
        kind = "aws-secret" if name == "AWS_SESSION_TOKEN" else f"env:{name}"  # the format, seen first, names it
        assert f"{name}=[REDACTED:{kind}]" in out
    assert "again:[REDACTED:env:PGPASSWORD]" in out
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "KEY_PATHS", "TOKENIZERS_PARALLELISM", "SESSION_TIMEOUT",
                 "API_KEY_SHORT", "OPENAI_API_KEY_FOR_TESTS", "HOME"):  # fmt: skip
        assert f"{name}={ENV[name]}" in out
    assert red.found(text) and not red.found(filler + "nothing here" + filler)


@pytest.mark.parametrize("pad", [0, LONG_TEXT], ids=["short", "long"])
def test_known_key_formats_are_replaced_by_kind(pad: int) -> None:
    red = Redactor()  # formats only
    filler = "y = 2\n" * (pad // 6)
    for kind, key in KEYS.items():
        out = red.text(f"{filler}key: '{key}', then more{filler}")
        assert out == f"{filler}key: '[REDACTED:{kind}]', then more{filler}", kind
    out = red.text(
        f"{filler}Authorization: Bearer abc.DEF-123_456~xyz/789=\n"
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n"
        '{"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}\n'
        f"postgres://bob:s3cr3t@db:5432/x\n{PEM}\nafter{filler}"
    )
    assert out == (
        f"{filler}Authorization: Bearer [REDACTED:bearer-token]\n"
        "aws_secret_access_key = [REDACTED:aws-secret]\n"
        '{"AWS_SECRET_ACCESS_KEY": "[REDACTED:aws-secret]"}\n'
        f"postgres://bob:[REDACTED:url-password]@db:5432/x\n[REDACTED:private-key]\nafter{filler}"
    )


def test_ordinary_text_is_left_alone(red: Redactor) -> None:
    assert red.text(ORDINARY) == ORDINARY
    assert not red.found(ORDINARY)
    assert red.text(ORDINARY * 100) == ORDINARY * 100  # the long path too


def test_a_secret_in_json_encoded_text_is_found(red: Redactor) -> None:
    line = json.dumps({"log": f"line one\n{ENV['HRL_TEST_SECRET_TOKEN']}\tand {KEYS['github-token']}\n"})
    out = red.text(line)
    assert "[REDACTED:env:HRL_TEST_SECRET_TOKEN]" in out and "[REDACTED:github-token]" in out
    assert json.loads(out)  # still JSON


def test_obj_redacts_chat_messages_and_leaves_numbers_alone(red: Redactor) -> None:
    ids = list(range(100_000))
    call = {"name": "bash", "arguments": json.dumps({"command": f"echo {ENV['PGPASSWORD']}"})}
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": [{"type": "text", "text": f"use {KEYS['openai-key']}"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": "call_1", "content": ENV["PGPASSWORD"] + "\n"},
        {"ids": ids, "logprobs": (-0.5, -1.0), "n": 3, "ok": True, "none": None},
    ]
    out = red.obj(messages)
    assert out[0] == messages[0]
    assert out[1]["content"][0]["text"] == "use [REDACTED:openai-key]"
    assert json.loads(out[2]["tool_calls"][0]["function"]["arguments"]) == {"command": "echo [REDACTED:env:PGPASSWORD]"}
    assert out[3] == {"role": "tool", "tool_call_id": "call_1", "content": "[REDACTED:env:PGPASSWORD]\n"}
    assert out[4]["ids"] is ids and out[4]["logprobs"] == (-0.5, -1.0) and out[4]["n"] == 3
    assert "hunter" not in json.dumps(red.obj({ENV["GITHUB_PAT"]: 1}))  # keys too
    assert messages[3]["content"] == ENV["PGPASSWORD"] + "\n"  # the input is not changed


def test_longest_value_wins_when_one_holds_another() -> None:
    red = Redactor({"SHORT_TOKEN": "abcdefgh", "LONG_TOKEN": "abcdefgh-ijklmnop"}, known_formats=False)
    assert red.text("x abcdefgh-ijklmnop y abcdefgh") == "x [REDACTED:env:LONG_TOKEN] y [REDACTED:env:SHORT_TOKEN]"
    long = "z" * LONG_TEXT + " abcdefgh-ijklmnop abcdefgh"
    assert red.text(long).endswith(" [REDACTED:env:LONG_TOKEN] [REDACTED:env:SHORT_TOKEN]")


def test_an_empty_redactor_changes_nothing() -> None:
    red = Redactor(known_formats=False)
    obj = {"a": [KEYS["openai-key"]]}
    assert red.obj(obj) is obj and red.text(KEYS["openai-key"]) == KEYS["openai-key"] and not red.found("sk-")


def test_redactor_is_fast_on_a_large_text(red: Redactor) -> None:
    text = (Path(__file__).read_text() + "\n") * (2_000_000 // len(Path(__file__).read_text()))
    started = time.thread_time()  # this thread's CPU time: waiting for a busy core does not count
    red.text(text)
    # 2 MB in under 1 s of CPU: ~0.05 s on a current core, so 20× for a slower or shared one
    assert len(text) / (time.thread_time() - started) > 2e6


def trace_with_secrets() -> dict:
    secret = ENV["HRL_TEST_SECRET_TOKEN"]
    return {
        "schema": "hrl.trace/1", "trace_id": "t1", "session": "sessTOKENabcdefgh", "task_id": "task-1",
        "group_id": "it0:task-1", "agent": {"name": "fake", "version": "1"}, "env": {"sandbox": "local"},
        "model": {"name": "m"}, "status": "ok", "failure_reason": None, "reward": 1.0,
        "reward_info": {"log": f"FAILED test_x - {secret}", "tests": {"t::a": "PASSED"}},
        "started_at": 1.0, "ended_at": 2.0,
        "calls": [{"call_id": "c1", "dialect": "chat", "stream": False, "side": False, "started_at": 0.0,
                   "first_token_at": 0.0, "ended_at": 0.1, "prompt_ids": [1, 2, 3], "response_ids": [4],
                   "response_logprobs": [-0.1], "versions": [[0, 0]], "finish_reason": "error",
                   "error": f"engine said {KEYS['openai-key']}"}],
        "tools": [{"name": f"tool-{secret}", "tool_call_id": "x", "started_at": 0.0, "ended_at": 0.1}],
        "metadata": {"agent_stdout_tail": f"export OPENAI_API_KEY={ENV['OPENAI_API_KEY']}", "episode": "e#0"},
    }  # fmt: skip


def test_trace_writer_redacts_every_text_field(tmp_path: Path, red: Redactor) -> None:
    trace = trace_with_secrets()
    before = json.dumps(trace)
    TraceWriter(tmp_path / "t.jsonl", redactor=red).write(trace)
    raw = (tmp_path / "t.jsonl").read_text()
    assert json.dumps(trace) == before  # the caller's trace is untouched
    for secret in (ENV["HRL_TEST_SECRET_TOKEN"], ENV["OPENAI_API_KEY"], KEYS["openai-key"]):
        assert secret not in raw
    (back,) = read_traces(tmp_path / "t.jsonl")
    assert back["reward_info"]["log"] == "FAILED test_x - [REDACTED:env:HRL_TEST_SECRET_TOKEN]"
    assert back["calls"][0]["error"] == "engine said [REDACTED:openai-key]"
    assert back["tools"][0]["name"] == "tool-[REDACTED:env:HRL_TEST_SECRET_TOKEN]"
    assert back["metadata"]["agent_stdout_tail"] == "export OPENAI_API_KEY=[REDACTED:env:OPENAI_API_KEY]"
    assert back["session"] == trace["session"] and back["calls"][0]["prompt_ids"] == [1, 2, 3]
    assert back == redact_trace(trace, red)


def test_trace_writer_can_write_byte_exact(tmp_path: Path) -> None:
    trace = trace_with_secrets()
    TraceWriter(tmp_path / "t.jsonl", redactor=False).write(trace)
    assert (tmp_path / "t.jsonl").read_text() == encode_trace(trace)


def test_default_trace_writer_redacts_the_hosts_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hrl.runners import redact

    monkeypatch.setenv("HRL_TEST_SECRET_TOKEN", ENV["HRL_TEST_SECRET_TOKEN"])
    redact.default_redactor.cache_clear()
    try:
        TraceWriter(tmp_path / "t.jsonl").write(trace_with_secrets())
    finally:
        redact.default_redactor.cache_clear()
    raw = (tmp_path / "t.jsonl").read_text()
    assert ENV["HRL_TEST_SECRET_TOKEN"] not in raw and "[REDACTED:env:HRL_TEST_SECRET_TOKEN]" in raw
