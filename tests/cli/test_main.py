"""The `hrl` command as users run it: a light --help, one-line errors with hints, `hrl serve` end to end."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HRL = [sys.executable, "-m", "hrl.cli"]


def hrl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HRL, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, "NO_COLOR": "1"}
    )


_HEAVY = ("torch", "transformers", "aiohttp", "peft")  # what makes an interpreter start take seconds


def test_version_and_help_load_nothing_heavy():
    """`hrl --version` and `hrl --help` stay fast because they import none of the heavy libraries (timing them would
    measure the machine's load, not the code)."""
    out = hrl("--version")
    assert out.returncode == 0 and out.stdout.startswith("hrl ")
    probe = (
        "import sys\nsys.argv = ['hrl', '--help']\nfrom hrl.cli.main import run\nrun()\n"
        f"print('LOADED', sorted(m for m in {_HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "serve" in out.stdout, out.stderr
    assert "LOADED []" in out.stdout, out.stdout.splitlines()[-1]


def test_models_tiny_is_deterministic(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d, seed in [(a, "3"), (b, "3"), (c, "4")]:
        assert hrl("models", "tiny", str(d), "--seed", seed, timeout=600).returncode == 0  # a hang, not a speed
    files = sorted(p.name for p in a.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(files)
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def _assert_clean_error(out: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith("Error: ") and lines[-1].startswith("Hint: "), out.stderr
    for needle in needles:
        assert needle in out.stderr


def test_serve_missing_model_is_one_error_line(tmp_path):
    _assert_clean_error(hrl("serve", "--model", str(tmp_path / "missing")), "model not found")


def test_serve_port_in_use(tiny_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        _assert_clean_error(hrl("serve", "--model", tiny_model, "--port", str(port)), f"port {port}", "--port")


def test_serve_unknown_engine(tiny_model):
    out = hrl("serve", "--model", tiny_model, "--engine", "nope", "--port", "0")
    _assert_clean_error(out, "unknown engine 'nope'", "embedded")
    assert out.returncode == 2


def test_a_commands_own_usage_error_exits_2_without_a_traceback():
    """typer.BadParameter raised inside a command (typer ships its own click copy) is a usage error, not a bug."""
    out = hrl("rollout", "--agent", "codex")
    assert out.returncode == 2, out.stderr
    assert "give --recipe or --tasks" in out.stderr and "Traceback" not in out.stderr and "bug" not in out.stderr


def test_serve_broken_model_fails_to_start_without_orphans(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    _assert_clean_error(hrl("serve", "--model", str(bad), "--port", "0"))


@contextlib.contextmanager
def served(model: str, *extra: str, env: dict[str, str] | None = None):
    """`hrl serve` on a free port; yields (url, headers carrying the control token it wrote)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = Path(tempfile.mkdtemp(prefix="hrl-serve-test-"))
    proc = subprocess.Popen(
        [*HRL, "serve", "--model", model, "--port", str(port), *extra],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HRL_STATE_DIR": str(state), **(env or {})},
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.3)
        token_file = state / "control-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        yield f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {token_file.read_text().strip()}"}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        shutil.rmtree(state, ignore_errors=True)


def test_serve_says_which_tool_and_reasoning_parser(tiny_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = Path(tempfile.mkdtemp(prefix="hrl-serve-test-"))
    argv = [*HRL, "serve", "--model", tiny_model, "--engine", "scripted", "--port", str(port)]
    proc = subprocess.Popen([*argv, "--tool-parser", "mistral", "--reasoning-parser", "think-open",
                             "--sampling", "honest"], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HRL_STATE_DIR": str(state)})  # fmt: skip
    lines: list[str] = []
    try:
        for line in proc.stderr or []:  # until it serves (or dies: the lines then say why)
            lines.append(line)
            if line.startswith("serving "):
                break
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        shutil.rmtree(state, ignore_errors=True)
    assert "tool calls parsed as mistral (--tool-parser)\n" in lines, lines
    assert "reasoning parsed as think-open (--reasoning-parser)\n" in lines, lines
    assert any(line.startswith("sampling honest: every call at temperature 1") for line in lines), lines


def test_serve_openai_sdk_stream_and_not(tiny_model):
    import httpx
    from openai import OpenAI

    with served(tiny_model) as (url, control):
        anonymous = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        assert [m.id for m in anonymous.models.list()] == [tiny_model]  # the data plane lists models to anyone
        assert httpx.get(url + "/sessions").status_code == 401  # the control plane needs the token
        token = httpx.post(url + "/sessions", headers=control).json()["token"]
        assert len(token) >= 22  # ≥ 128 random bits, url-safe base64
        client = OpenAI(base_url=f"{url}/s/{token}/v1", api_key="unused")
        assert [m.id for m in client.models.list()] == [tiny_model]
        msgs = [{"role": "user", "content": "hi"}]
        full = client.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0)
        chunks = list(
            client.chat.completions.create(
                model="m",
                messages=msgs,
                max_tokens=12,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens == 12
    assert full.choices[0].finish_reason == "length"


def test_package_layout_is_the_documented_one():
    root = Path(__file__).resolve().parents[2]
    for name in ["cli", "runners", "sandboxes", "train", "recipes", "tests", "pyproject.toml", "README.md"]:
        assert (root / name).exists(), name


def test_serve_lora_checkpoint_writes_open_sessions_on_stop(tiny_lora, tmp_path):
    """`hrl serve` on a LoRA checkpoint samples from the adapter (policy 1), and Ctrl-C writes the session still
    open as a trace: nothing recorded is lost when the server stops."""
    import json
    import urllib.request

    traces = tmp_path / "traces.jsonl"
    with served(tiny_lora, "--traces", str(traces), "--open-sessions") as (url, _):
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0}
        req = urllib.request.Request(
            url + "/s/open-one/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            assert json.load(r)["usage"]["completion_tokens"] == 5
    [trace] = [json.loads(line) for line in traces.read_text().splitlines()]
    assert trace["metadata"]["ended_by"] == "proxy stop"
    [call] = trace["calls"]
    assert call["versions"] == [[0, 1]] and len(call["response_ids"]) == 5


def test_a_sandbox_error_is_mapped_not_called_a_bug(capsys):
    """SandboxError is a domain error with its own row: an unreachable Docker daemon is a missing prerequisite
    (exit 4), a sandbox that failed is a failure (exit 1); neither is reported as a bug in hrl."""
    from hrl.cli.errors import report
    from hrl.sandboxes import SandboxError, SandboxUnavailableError

    assert report(SandboxUnavailableError("cannot reach the Docker daemon: gone", hint="start dockerd")) == 4
    assert report(SandboxError("cannot exec in container 1234: gone")) == 1
    err = capsys.readouterr().err
    assert "Hint: start dockerd" in err and "hrl sandbox prune" in err and "bug" not in err, err


def test_resume_without_a_docker_daemon_exits_4_with_a_hint(tmp_path):
    """Through the CLI: `--resume` first prunes the run's leftover containers, which needs the daemon."""
    from hrl.runners.rundir import RunDir

    run = RunDir(tmp_path / "run")
    run.create({"rollout": {"sandbox": "docker", "run_id": "hrl-nodaemon"}})
    run.save_state(1, 1, None)
    env = {**os.environ, "NO_COLOR": "1", "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    out = subprocess.run(
        [*HRL, "train", "--run-dir", str(run.path), "--resume"], capture_output=True, text=True, timeout=120, env=env
    )
    _assert_clean_error(out, "cannot reach the Docker daemon", "start dockerd")
    assert out.returncode == 4 and "bug" not in out.stderr


def test_serve_keeps_a_host_secret_out_of_prompts_and_traces(tiny_model, tmp_path):
    """A secret in the server's environment that comes back in a tool result (the agent ran `env`) is replaced
    before tokenization: neither the prompt ids nor the trace file carry it."""
    import httpx

    secret = "s3cr3t-" + "x9" * 12
    traces = tmp_path / "traces.jsonl"
    with served(tiny_model, "--traces", str(traces), env={"HRL_TEST_SECRET_TOKEN": secret}) as (url, control):
        token = httpx.post(url + "/sessions", headers=control).json()["token"]
        msgs = [{"role": "user", "content": "run env"}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": f"HRL_TEST_SECRET_TOKEN={secret}\nHOME=/root"}]  # fmt: skip
        r = httpx.post(f"{url}/s/{token}/v1/chat/completions", json={"messages": msgs, "max_tokens": 2}, timeout=60)
        assert r.status_code == 200, r.text
        assert httpx.post(f"{url}/s/{token}/end", headers=control).status_code == 200
    raw = traces.read_text()
    assert secret not in raw
    from transformers import AutoTokenizer

    from hrl.runners.trace import all_prompt_ids, read_traces

    (trace,) = read_traces(traces)
    text = AutoTokenizer.from_pretrained(tiny_model).decode(all_prompt_ids(trace)[0])
    assert secret not in text and "REDACTED" in text


def test_serve_workers_need_a_shared_engine(tiny_model):
    out = hrl("serve", "--model", tiny_model, "--engine", "embedded", "--workers", "2", "--port", "0")
    _assert_clean_error(out, "--workers 2 needs an engine the workers share", "--engine http://")


def test_serve_workers_report_a_worker_that_cannot_start(tiny_model):
    with socket.socket() as s:  # a port nothing answers on: no vLLM server there
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = hrl("serve", "--model", tiny_model, "--engine", f"http://127.0.0.1:{dead}", "--workers", "2",
              "--port", str(port))  # fmt: skip
    _assert_clean_error(out, "proxy worker", "did not start")


def test_a_native_thread_still_running_at_exit_does_not_change_the_exit_code():
    """A finished run exits with the code it chose: a daemon thread still inside a torch op when the command ends
    (an embedded engine's last step) aborted the interpreter's teardown with 'terminate called without an active
    exception' (exit 134) after the traces were written. `main` exits without that teardown."""
    probe = (
        "import sys, threading, time, torch\n"
        "def spin():\n    a = torch.randn(1024, 1024)\n    while True:\n        a = (a @ a).tanh()\n"
        "threading.Thread(target=spin, daemon=True).start()\ntime.sleep(0.3)\n"
        "sys.argv = ['hrl', '--version']\nfrom hrl.cli.main import main\nmain()\n"
    )
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        assert (out.returncode, out.stdout.split()[:1]) == (0, ["hrl"]), out.stderr
