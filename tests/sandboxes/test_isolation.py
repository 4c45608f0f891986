"""Secrets stay out of the agent's reach: a local sandbox's commands see an allowlist of host variables, not the
host's environment; the agent's sandbox (local and docker) holds neither the hidden tests nor the gold patch,
not even in an image repository's git history; the proxy's unix socket is its owner's only, and a docker agent
still reaches the proxy through it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web

from hrl.runners.proxy.server import run_server
from hrl.runners.tasks.patches import file_diff
from hrl.runners.tasks.task import Task
from hrl.runners.tasks.verifier import TestVerifier
from hrl.sandboxes import SandboxSpec
from hrl.sandboxes.docker import DockerBackend
from hrl.sandboxes.local import PASSTHROUGH_VAR, LocalBackend, bwrap_works

T = TypeVar("T")
IMAGE = os.environ.get("HRL_BASE_IMAGE", "hrl/base:bookworm")
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


def test_local_sandbox_cannot_read_task_files_other_sandboxes_or_hrl(tmp_path: Path) -> None:
    """The local sandbox's commands run in their own mount and pid namespace: the task file and the run directory
    (`hidden_paths`), every other sandbox under the same root (grading folders hold hidden tests) and hrl's own
    processes (whose memory holds the tasks) are out of sight; what a command leaves running ends with it."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"test_patch": "MARKER-hidden-test"}\n')
    run_dir = tmp_path / "run"
    (run_dir / "traces").mkdir(parents=True)
    (run_dir / "traces" / "iter-0000.jsonl").write_text("MARKER-trace\n")
    backend = LocalBackend(root=str(tmp_path / "sandboxes"))
    assert bwrap_works() and backend.isolate, "bubblewrap is needed (.ci/setup.sh installs it)"

    async def main() -> dict[str, str]:
        spec = SandboxSpec(hidden_paths=[str(tasks), str(run_dir)])
        async with (
            await backend.create(SandboxSpec(), "run", "grading") as grading,
            await backend.create(spec, "run", "agent") as agent,
        ):
            await grading.write_file("tests/test_x.py", b"MARKER-grading")
            probe = (
                f"cat {tasks}; ls {run_dir}; cat {grading.root}/work/tests/test_x.py; ls {backend.root}; "
                f"test -e /proc/{os.getpid()} && echo HRL-VISIBLE; echo tmp=$TMPDIR; (sleep 60 &) ; echo done"
            )
            result = await agent.exec(probe, timeout_s=60)
            return {"out": result.stdout + result.stderr, "root": agent.root.name}

    seen = run(main())
    assert "MARKER" not in seen["out"], seen["out"]
    assert "HRL-VISIBLE" not in seen["out"] and "done" in seen["out"], seen["out"]
    assert seen["root"] in seen["out"] and "grading" not in seen["out"].split("tmp=")[0].split(seen["root"])[0]


def test_rollout_with_a_local_sandbox_warns(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"  # a valid task file: the warning comes once the names and paths are good
    tasks.write_text(
        json.dumps({"instance_id": "t1", "problem_statement": "fix it", "FAIL_TO_PASS": ["t.py::t"]}) + "\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "hrl.cli", "rollout", "--agent", "codex", "--tasks", str(tasks), "--sandbox", "local",
         "--model", str(tmp_path / "no-model")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"}, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "model not found" in out.stderr  # stops at the bad model, after the warning
    assert out.stderr.count("Warning: --sandbox local") == 1, out.stderr
    assert "in a bubblewrap namespace" in out.stderr, out.stderr


# --------------------------------------------------------------------------------------------------------------
# hidden tests and the gold patch never enter the agent's sandbox
# --------------------------------------------------------------------------------------------------------------

# A git repository at the workdir as an image would hold it: the base commit, then the fix and the hidden tests in
# later history (a branch, a tag, a commit left only in the reflog), the work tree back at the base.
IMAGE_REPO = r"""
set -e
m="$1"
g() { git -c user.name=x -c user.email=x@x -c commit.gpgsign=false "$@"; }
g init -q . && printf 'x = 1\n' > m.py && printf '*.log\n' > .gitignore && printf 'kept\n' > tracked.log
g add m.py .gitignore && g add -f tracked.log && g commit -qm base && base=$(g rev-parse HEAD)
g checkout -qb fix && mkdir -p tests && printf "def test_x():\n    assert '%s-test'\n" "$m" > tests/test_m.py
printf 'x = 2  # %s-gold\n' "$m" > m.py && g add -A && g commit -qm fix && g tag v-fix
g checkout -q "$base" && printf '# %s-dangling\n' "$m" > d.py && g add d.py && g commit -qm dangling
g checkout -q "$base" && g branch -qD fix && echo "$base"
"""
# Prints what the agent could find: files holding the marker, git objects holding it, the marker in the env.
SEARCH = r"""
m="$1"; shift
files=$(timeout 120 grep -rlF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -e "$m" "$@" 2>/dev/null)
rc=$?; [ $rc = 124 ] && { echo "search timed out"; exit 3; }
objects=$(git cat-file --batch-all-objects --batch 2>/dev/null | grep -caF -e "$m")
echo "files=[$files] objects=$objects env=$(env | grep -cF -e "$m")"
"""
CLEAN = "files=[] objects=0 env=0"


def hidden_task(marker: str, image_repo: str | None = None) -> Task:
    """A task whose hidden tests and gold fix carry `marker`; from a snapshot, or (image_repo = the base commit)
    from a repository already at the workdir."""
    tests = file_diff("tests/test_m.py", None, f"def test_x():\n    assert '{marker}-test'\n")
    return Task(
        instance_id="secret-task", problem_statement="Make x 2.", FAIL_TO_PASS=["tests/test_m.py::test_x"],
        test_patch=tests, patch=file_diff("m.py", "x = 1\n", f"x = 2  # {marker}-gold\n"), image=IMAGE,
        workdir="/work", base_commit=image_repo, repo_snapshot=None if image_repo else {"m.py": "x = 1\n"},
        test_cmd=f"{sys.executable} -m pytest -rA -p no:cacheprovider tests",
    )  # fmt: skip


async def prepared_and_searched(backend: Any, kind: str, roots: list[str] | None, **verifier: Any) -> str:
    """Prepare the agent's sandbox of a hidden task as a rollout does, then search it from inside; returns
    the search's report. roots None: the sandbox's own root dir (local)."""
    marker = f"HRLHIDDEN{uuid.uuid4().hex}"
    v = TestVerifier(backend, **verifier)
    spec = v.sandbox_spec(hidden_task(marker))
    async with await backend.create(spec, "test-hidden", f"ep-{kind}") as sandbox:
        base = None
        if kind == "image":
            made = await sandbox.exec(["bash", "-c", IMAGE_REPO, "_", marker], timeout_s=60)
            assert made.exit_code == 0, made
            base = made.stdout.split()[-1]
        task = hidden_task(marker, base)
        await v.prepare(sandbox, task)
        assert (await sandbox.read_file("m.py")) == b"x = 1\n"
        if kind == "image":  # the base state is the same as the image's: tracked files kept, history gone
            files = await sandbox.exec(["git", "ls-files"], timeout_s=30)
            assert files.stdout.split() == [".gitignore", "m.py", "tracked.log"], files
        where = roots if roots is not None else [str(sandbox.root)]
        result = await sandbox.exec(["bash", "-c", SEARCH, "_", marker, *where], timeout_s=180)
        assert result.exit_code == 0, result
        return result.stdout.strip()


@pytest.mark.parametrize("kind", ["snapshot", "image"])
def test_local_agent_sandbox_holds_no_hidden_tests_or_gold_patch(tmp_path: Path, kind: str) -> None:
    assert run(prepared_and_searched(LocalBackend(root=str(tmp_path)), kind, None)) == CLEAN


def test_the_search_finds_an_image_history_that_is_kept(tmp_path: Path) -> None:
    """The check above can fail: with the image's history kept, the fix and the tests are in its git objects."""
    report = run(prepared_and_searched(LocalBackend(root=str(tmp_path)), "image", None, keep_image_history=True))
    assert report.startswith("files=[] objects=") and report != CLEAN, report


@pytest.mark.docker
@pytest.mark.parametrize("kind", ["snapshot", "image"])
def test_docker_agent_sandbox_holds_no_hidden_tests_or_gold_patch(kind: str) -> None:
    assert run(prepared_and_searched(DockerBackend(), kind, ["/"])) == CLEAN


def test_local_grading_writes_the_tests_only_in_its_own_fresh_directory(tmp_path: Path) -> None:
    marker = f"HRLHIDDEN{uuid.uuid4().hex}"
    agent_backend, grade_backend = LocalBackend(root=str(tmp_path / "agent")), LocalBackend(root=str(tmp_path / "g"))
    graded: list[Path] = []
    create = grade_backend.create

    async def recording(*args: Any) -> Any:
        sandbox = await create(*args)
        graded.append(sandbox.root)
        return sandbox

    grade_backend.create = recording  # type: ignore[method-assign]

    async def main() -> tuple[Any, list[str]]:
        v, task = TestVerifier(grade_backend), hidden_task(marker)
        async with await agent_backend.create(v.sandbox_spec(task), "test-grade", "ep") as sandbox:
            await v.prepare(sandbox, task)
            await sandbox.write_file("m.py", b"x = 2\n")  # the agent's fix
            verdict = await v.verify(sandbox, task)
            grep = ["grep", "-rlF", marker, str(sandbox.root)]
            holding = await asyncio.to_thread(subprocess.run, grep, capture_output=True, text=True, check=False)
            return verdict, holding.stdout.split()

    verdict, holding = run(main())
    assert verdict.reward == 1.0, verdict  # graded with the hidden test …
    assert holding == []  # … which never entered the agent's sandbox
    assert len(graded) == 1 and not graded[0].exists()  # written in a fresh directory, deleted after grading


# --------------------------------------------------------------------------------------------------------------
# the proxy's unix socket
# --------------------------------------------------------------------------------------------------------------


def hello_app() -> web.Application:
    app = web.Application()

    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hello from the proxy socket")

    app.router.add_get("/hello", hello)
    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def serving_socket(sock: str, then: Any) -> Any:
    ready = asyncio.Event()
    server = asyncio.create_task(run_server(hello_app(), "127.0.0.1", free_port(), ready, unix_socket=sock))
    try:
        await asyncio.wait_for(ready.wait(), 30)
        return await then()
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)


@pytest.fixture
def socket_dir() -> Any:
    path = Path(tempfile.mkdtemp(prefix="hrl-sock-"))  # short: unix socket paths are limited to ~107 bytes
    path.chmod(0o755)  # as runners.serving.stack makes it
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_proxy_socket_is_its_owners_only(socket_dir: Path) -> None:
    sock = socket_dir / "proxy.sock"

    async def mode() -> int:
        return (await asyncio.to_thread(sock.stat)).st_mode & 0o777

    assert run(serving_socket(str(sock), mode)) == 0o600


@pytest.mark.docker
def test_docker_agent_reaches_the_owner_only_proxy_socket(socket_dir: Path) -> None:
    """Through the forwarder (root in the container), as the image's user (root) and as an unprivileged one."""
    sock = str(socket_dir / "proxy.sock")
    probe = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8123/hello', timeout=10).read().decode())"

    async def from_container() -> list[str]:
        spec = SandboxSpec(image=IMAGE, network="proxy", proxy_socket=sock, proxy_port=8123)
        async with await DockerBackend().create(spec, "test-socket", "ep") as sandbox:
            outs = []
            for user in ("", "65534"):
                result = await sandbox.exec(["python3", "-c", probe], timeout_s=60, user=user)
                assert result.exit_code == 0, (user, result)
                outs.append(result.stdout.strip())
            return outs

    assert run(serving_socket(sock, from_container)) == ["hello from the proxy socket"] * 2


def test_a_bwrap_that_fails_to_set_up_is_run_again_and_a_commands_own_failure_is_not(tmp_path: Path,
                                                                                     monkeypatch) -> None:  # fmt: skip
    """bwrap's read-only bind of / fails with EINVAL when a mount comes or goes meanwhile (a Docker container on the
    same host): that exec never ran its command and is run again. A command that fails by itself runs once."""
    assert bwrap_works(), "bubblewrap is needed (.ci/setup.sh installs it)"
    fake, count = tmp_path / "bin", tmp_path / "setups"
    fake.mkdir()
    (fake / "bwrap").write_text(
        "#!/bin/sh\n"
        f"echo x >> {count}\n"
        f'if [ "$(wc -l < {count})" -lt 3 ]; then\n'
        '  echo "bwrap: Can\'t bind mount /oldroot/ on /newroot/: Unable to apply mount flags: Invalid argument" >&2\n'
        "  exit 1\n"
        "fi\n"
        f'exec {shutil.which("bwrap")} "$@"\n'
    )
    (fake / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    backend = LocalBackend(root=str(tmp_path / "sandboxes"))

    async def main() -> tuple[Any, int, Any, int]:
        async with await backend.create(SandboxSpec(), "run", "ep") as box:
            ok = await box.exec("echo ran >> ran.txt; echo hi")
            setups = len(count.read_text().splitlines())
            failed = await box.exec('echo ran >> ran.txt; echo "bwrap: Can\'t bind mount it" >&2; exit 1')
            return ok, setups, failed, len((await box.read_file("ran.txt")).splitlines())

    ok, setups, failed, ran = run(main())
    assert (ok.exit_code, ok.stdout, setups) == (0, "hi\n", 3)  # two failed set-ups, then the command
    assert failed.exit_code == 1 and ran == 2  # each command ran once
