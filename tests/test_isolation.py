"""Secrets stay out of the agent's reach: a local sandbox's commands see an allowlist of host variables, not the
host's environment."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

from hrl.sandboxes import SandboxSpec
from hrl.sandboxes.local import PASSTHROUGH_VAR, LocalBackend

T = TypeVar("T")
SECRETS = {"HRL_TEST_SECRET_TOKEN": "tok-" + uuid.uuid4().hex, "AWS_SECRET_ACCESS_KEY": "wJalr" + uuid.uuid4().hex}


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


def env_of(output: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


# --------------------------------------------------------------------------------------------------------------
# the local sandbox's environment
# --------------------------------------------------------------------------------------------------------------


def test_local_sandbox_sees_an_allowlist_of_the_hosts_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.delenv(PASSTHROUGH_VAR, raising=False)

    async def main(backend: LocalBackend) -> tuple[dict[str, str], str]:
        async with await backend.create(SandboxSpec(env={"A": "spec"}), "test-env", "ep") as sandbox:
            result = await sandbox.exec(["env"], env={"B": "exec"})
            assert result.exit_code == 0, result
            return env_of(result.stdout), str(sandbox.root)

    env, root = run(main(LocalBackend(root=str(tmp_path))))
    assert not set(SECRETS) & set(env)
    assert not any(value in f"{k}={v}" for value in SECRETS.values() for k, v in env.items())
    assert (env["PATH"], env["LC_ALL"], env["A"], env["B"]) == (os.environ["PATH"], "C.UTF-8", "spec", "exec")
    assert env["HOME"] == f"{root}/home"  # the sandbox's own, not the host's
    assert set(env) <= {"PATH", "HOME", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL",
                        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
                        "A", "B", "HRL_SANDBOX", "HRL_EXEC", "PWD", "SHLVL", "_"} | {k for k in env if k.startswith("LC_")}  # fmt: skip

    monkeypatch.setenv(PASSTHROUGH_VAR, "HRL_TEST_*, NOT_SET")  # users who need more name it
    env, _ = run(main(LocalBackend(root=str(tmp_path))))
    assert env["HRL_TEST_SECRET_TOKEN"] == SECRETS["HRL_TEST_SECRET_TOKEN"] and "AWS_SECRET_ACCESS_KEY" not in env
    env, _ = run(main(LocalBackend(root=str(tmp_path), env_passthrough=["AWS_*"])))
    assert "AWS_SECRET_ACCESS_KEY" in env and "HRL_TEST_SECRET_TOKEN" not in env
