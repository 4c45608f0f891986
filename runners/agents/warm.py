"""A Python harness started ahead of its episode: its heavy imports done in a warm sandbox, off the episode's clock.

mini-swe-agent spends most of its start-up importing litellm (about 4 s of CPU on two cores, `harness_start_s` in
the trace). A sandbox the pool makes ahead (`rollout.warm_sandboxes`) also starts a one-shot launcher there: the
harness's own Python, with the runner's `warm_imports` imported and the runner's fixed environment
(`warm_env`). When the episode starts, the agent command is a small client instead of the CLI itself: it connects
to the launcher's unix socket, hands over its stdin, stdout and stderr (SCM_RIGHTS) with its argv, environment and
working directory, and exits with the harness's exit status. The launcher takes them on, as if it had been started
with them, and runs the CLI's console script in-process (`runpy`), so the harness runs the same code with the same
arguments, environment and files: what it sends is unchanged, only the imports were done before.

- One episode a launcher: it stops listening once a client connects, and is gone when the harness ends.
- The harness's processes stay the episode's: they carry the client's environment (the sandbox's per-exec mark
  among it), and the launcher kills its process group when the client goes (a time budget, a kill).
- A launcher that is not ready in `WAIT_S` (still importing on a busy machine, or broken) is not waited for: the
  client runs the CLI itself, a cold start, and says so on stderr.
- Only for sandboxes made ahead and never reused (`rollout.reuse: group` resets a sandbox between episodes, and a
  process kept across that reset would cross episodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import uuid
from dataclasses import dataclass, field
from typing import Any

from hrl.runners.agents.base import AgentRunner
from hrl.runners.agents.install import AgentInstall
from hrl.sandboxes.base import Sandbox, SandboxError

__all__ = ["CLIENT", "LAUNCHER", "WarmHarness", "start_warm_harness"]

log = logging.getLogger(__name__)

WAIT_S = 60  # how long an episode's client waits for its launcher to finish importing before starting cold
STOP_GRACE_S = 2.0  # how long `stop` waits for the command of a closed sandbox's launcher to end before cancelling it
DIR = "/tmp/hrl-warm"

LAUNCHER = r"""
import importlib, json, os, runpy, shutil, signal, socket, struct, sys, threading, traceback
path, modules = sys.argv[1], sys.argv[2:]
try:
    os.setpgid(0, 0)  # the harness and every process it starts: one group, killed whole when the client goes
except PermissionError:
    pass  # a session leader already leads its own group
for name in modules:
    importlib.import_module(name)
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path + ".new")
os.chmod(path + ".new", 0o600)
server.listen(1)
os.rename(path + ".new", path)  # the socket appears once the imports are done
conn, _ = server.accept()
server.close()
os.unlink(path)  # one episode a launcher: nobody else connects
data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
size = struct.unpack("!I", data[:4])[0]
data = data[4:]
while len(data) < size:
    chunk = conn.recv(size - len(data))
    if not chunk:
        os._exit(1)
    data += chunk
spec = json.loads(data)
for target, fd in enumerate(fds):
    os.dup2(fd, target)
    os.close(fd)

def watch():  # the client is gone (killed, timed out): so is the harness, with everything it started
    try:
        conn.recv(1)
    finally:
        os.killpg(0, signal.SIGKILL)

threading.Thread(target=watch, daemon=True).start()
os.environ.clear()
os.environ.update(spec["env"])
os.chdir(spec["cwd"])
program = shutil.which(spec["argv"][0], path=spec["env"].get("PATH")) or spec["argv"][0]
sys.argv = [program, *spec["argv"][1:]]
code = 0
try:
    runpy.run_path(program, run_name="__main__")
except SystemExit as exc:
    if isinstance(exc.code, int):
        code = exc.code
    elif exc.code is not None:
        print(exc.code, file=sys.stderr)
        code = 1
except BaseException:
    traceback.print_exc()
    code = 1
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except Exception:
        pass
conn.sendall(struct.pack("!i", code & 0xFF))
os._exit(code & 0xFF)
"""

CLIENT = r"""
import json, os, socket, struct, sys, time
path, wait, argv = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
deadline = time.monotonic() + wait
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
while True:
    try:
        conn.connect(path)
        break
    except (FileNotFoundError, ConnectionRefusedError):
        if time.monotonic() > deadline:
            print(f"hrl: the warm harness was not ready in {wait:g} s; starting {argv[0]} cold", file=sys.stderr)
            os.execvp(argv[0], argv)
        time.sleep(0.02)
body = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
socket.send_fds(conn, [struct.pack("!I", len(body)) + body], [0, 1, 2])
status = b""
while len(status) < 4:
    chunk = conn.recv(4 - len(status))
    if not chunk:  # the harness died without a status: killed, as a signal would show a cold start
        sys.exit(128 + 9)
    status += chunk
sys.exit(struct.unpack("!i", status)[0])
"""


@dataclass
class WarmHarness:
    """A launcher running in one sandbox for one runner; `claim` hands it to exactly one episode."""

    runner: str
    python: str  # the harness's interpreter in the sandbox
    socket: str
    client: str
    task: asyncio.Task[Any] | None = None
    claimed: bool = field(default=False)

    def claim(self, runner: AgentRunner) -> list[str] | None:
        """The argv prefix that runs `runner`'s command through this launcher, once; None when it is not this
        runner's or was claimed already."""
        if self.claimed or runner.name != self.runner:
            return None
        self.claimed = True
        return [self.python, self.client, self.socket, str(WAIT_S)]

    async def stop(self) -> None:
        """End the launcher's command once its sandbox is closed (the close killed it): a moment for the command to
        see that, then a cancel for what is left (which kills on the event loop)."""
        if self.task is not None and not self.task.done():
            await asyncio.wait({self.task}, timeout=STOP_GRACE_S)
            self.task.cancel()


async def start_warm_harness(sandbox: Sandbox, runner: AgentRunner, install: AgentInstall) -> WarmHarness | None:
    """Start `runner`'s launcher in `sandbox` (not waiting for its imports) and attach it to the sandbox as
    `hrl_warm`; None for a runner without `warm_imports` or an install without a Python of its own."""
    modules = tuple(runner.warm_imports)
    if not modules or runner.package_kind != "pypi" or runner.needs_tty or not install.path:
        return None
    python = posixpath.join(install.path[0], "python")
    name = uuid.uuid4().hex[:12]
    launcher, client = f"{DIR}/launcher-{name}.py", f"{DIR}/client-{name}.py"
    await sandbox.write_file(launcher, LAUNCHER.encode(), 0o644)
    await sandbox.write_file(client, CLIENT.encode(), 0o644)
    warm = WarmHarness(runner.name, python, f"{DIR}/{name}.sock", client)
    env = {"HOME": f"{DIR}/home-{name}", "PATH": ":".join([*install.path, "/usr/local/bin:/usr/bin:/bin"]),
           "LANG": "C.UTF-8", **runner.warm_env}  # fmt: skip
    argv = ["sh", "-c", 'mkdir -p "$HOME" && exec "$@" </dev/null >/dev/null 2>&1', "hrl-warm", python, launcher,
            warm.socket, *modules]  # fmt: skip

    async def run() -> None:
        # the sandbox closed under the command (the pool's close ends a launcher so): nothing to say
        with contextlib.suppress(asyncio.CancelledError, SandboxError, OSError):
            result = await sandbox.exec(argv, timeout_s=0, env=env)
            if result.exit_code not in (0, -9, 137) and not warm.claimed:
                log.warning("the warm %s launcher ended (exit %s) before an episode took it", runner.name,
                            result.exit_code)  # fmt: skip

    warm.task = asyncio.create_task(run())
    sandbox.hrl_warm = warm
    return warm
