"""The Chromium process beside hrl: found, started in a fresh profile in a process group of its own, and killed
whole; `Browser`, a started browser as hrl's grader and the agent's tools reach it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path

from hrl.runners.errors import HrlError, PrerequisiteError

# Without the networking flags Chromium's background connections are refused here and slow every start.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--proxy-server=http://127.0.0.1:9",  # loopback bypasses a proxy by default
)  # fmt: skip
START_TIMEOUT_S = 30.0


class BrowserError(HrlError):
    """The episode's browser could not be started or reached: an infrastructure failure, never a reward of 0."""


def find_chromium() -> str:
    """The Chromium binary: $HRL_CHROMIUM, else chromium / chromium-browser / google-chrome on PATH."""
    for name in (os.environ.get("HRL_CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    raise PrerequisiteError(
        "no Chromium found for browser tasks", hint="apt-get install chromium (or set HRL_CHROMIUM to the binary)"
    )


@dataclass
class Browser:
    """A started browser: its DevTools endpoint and the origin that serves the task's pages."""

    direct_url: str  # the browser's own endpoint: hrl's grader only
    site: str  # http://127.0.0.1:PORT: the task's pages
    pid: int
    allowed: tuple[str, ...] = ()
    blocked: list[str] = field(default_factory=list)  # requests hrl's interception failed (outside `allowed`)
    refused: list[str] = field(default_factory=list)  # the agent's CDP commands the relay refused
    cdp_url: str = ""  # ws://127.0.0.1:PORT/devtools/browser/ID: the relay, what the agent's browser tools connect to
    sandbox_id: str = ""  # the sandbox it runs in (pid 0), else "" (beside hrl, its process group `pid`)


async def start_chromium(profile: Path) -> tuple[asyncio.subprocess.Process, str]:
    """Chromium in the fresh profile `profile`, a process group of its own: (the process, its DevTools endpoint).
    Raises BrowserError."""
    # Chromium keeps its singleton socket in $TMPDIR (org.chromium.Chromium.*), which a killed browser never removes:
    # inside the profile, it goes with the profile.
    (tmp := profile / "tmp").mkdir(exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        find_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0", "about:blank",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,  # its own process group: killed whole on exit (the renderers and the zygote too)
        env={**os.environ, "TMPDIR": str(tmp)},
    )  # fmt: skip
    port_file = profile / "DevToolsActivePort"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
    while loop.time() < deadline:
        if port_file.is_file() and len(lines := port_file.read_text().split("\n")) >= 2 and lines[1]:
            return proc, f"ws://127.0.0.1:{lines[0].strip()}{lines[1].strip()}"
        if proc.returncode is not None:
            raise BrowserError(f"Chromium exited at start (exit {proc.returncode})")
        await asyncio.sleep(0.05)
    _kill_group(proc.pid)
    raise BrowserError(f"Chromium did not open its DevTools endpoint within {START_TIMEOUT_S:.0f} s")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def live_in_group(pgid: int) -> list[int]:
    """The processes of group `pgid` still running (zombies left for a parent that never reaps them do not count)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, pgrp, …
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                live.append(int(stat.parent.name))
    return live


async def reap(proc: asyncio.subprocess.Process, timeout_s: float = 10.0) -> None:
    """Kill the browser's process group and wait until none of it runs; raises BrowserError past `timeout_s`."""
    _kill_group(proc.pid)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    with contextlib.suppress(ProcessLookupError, TimeoutError):
        await asyncio.wait_for(proc.wait(), timeout_s)
    while (left := live_in_group(proc.pid)) and loop.time() < deadline:
        _kill_group(proc.pid)
        await asyncio.sleep(0.05)
    if left:
        raise BrowserError(f"browser processes {left} survived SIGKILL for {timeout_s:.0f} s")
