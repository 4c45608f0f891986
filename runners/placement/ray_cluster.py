"""Joining or starting the Ray cluster of `--placement ray`, with a deadline, and with SIGTERM still ending the process.

Why this is not a bare `ray.init()`:

- Given no address, Ray joins whatever `RAY_ADDRESS` or its address file (`/tmp/ray/ray_current_cluster`) names, and
  joining an address nobody answers retries for minutes inside Ray's C++ GCS client, where no Python signal handler
  runs: a dead cluster's leftover file made `hrl rollout --placement ray` hang 8 minutes, deaf to SIGTERM. Ray's GCS
  timeouts (`RAY_py_gcs_connect_timeout_s`, ...) are read once, when Ray is imported, and `_system_config` is refused
  when joining, so they cannot bound a join from here. A join therefore runs on a helper thread, after a TCP probe of
  the address, while the caller's thread waits for it until `placement.connect_timeout_s`.
- Without `placement.address` hrl starts a cluster of its own (`address="local"`), never one it happens to find.
- `ray.init` replaces the SIGTERM handler (the CLI's: stop as Ctrl-C does) with its own `sys.exit`, and the event
  loop's Ctrl-C handler only cancels the task, which a blocking call never sees. While Ray starts or joins, SIGTERM
  and SIGINT raise KeyboardInterrupt here; the handlers before come back after. A start cut short is stopped here
  (`ray.shutdown` knows no half-started node), and where Ray's start sits in C++ and cannot take the signal, a
  watchdog thread stops what it started and ends the process.

Ray is handed in by `placement.ray`, the one module that imports it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hrl.config import PlacementConfig
from hrl.runners.errors import PrerequisiteError, UsageError

__all__ = ["init_ray"]

Say = Callable[[str], object]
INIT_KWARGS: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
CLIENT_PORT = 10001  # Ray's default port of a head's client server (ray://HOST)
STOP_GRACE_S = 1.0  # a Ray start cut short: seconds its processes get after SIGTERM before SIGKILL (Ray's reaper's)
WATCHDOG_S = 2.0  # a signal during Ray's start the main thread has not taken up by then: the watchdog ends the process
EXIT_INTERRUPTED = 130  # as the CLI's for an interrupted command


def init_ray(ray: Any, cfg: PlacementConfig, say: Say = lambda _: None) -> bool:
    """Join the cluster at `cfg.address` within `cfg.connect_timeout_s`, or start a local one of this process's own;
    True when this process started it (and so stops it). Already initialised: False, nothing done. Call it on the
    main thread for the signal handling (elsewhere Ray starts as it would)."""
    if ray.is_initialized():
        return False
    with _interruptible():
        if cfg.address:
            _join(ray, cfg.address, cfg.connect_timeout_s)
            return False
        if env := os.environ.get("RAY_ADDRESS"):
            say(f"RAY_ADDRESS={env} ignored: without placement.address hrl starts a local Ray of its own")
        _start_local(ray, cfg.num_cpus or None)
    return True


def _start_local(ray: Any, num_cpus: int | None) -> None:
    """A new cluster on this machine ("local": whatever RAY_ADDRESS or Ray's address file of an earlier cluster
    says), its start stopped and KeyboardInterrupt raised on SIGTERM or SIGINT."""
    before = _descendants()
    with _Watchdog(before) as watchdog:
        try:
            ray.init(address="local", num_cpus=num_cpus, **INIT_KWARGS)
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, _interrupt)  # Ray's sys.exit out again, till `_interruptible` ends
        except (KeyboardInterrupt, SystemExit) as e:  # SystemExit: Ray's own SIGTERM handler, set during its start
            if watchdog.claim():
                _stop_started(ray, before)
            raise KeyboardInterrupt(str(e) or "interrupted while Ray started") from e


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """SIGTERM and SIGINT raise KeyboardInterrupt meanwhile (on the main thread; elsewhere no handler can be set); the
    handlers before come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in before:
        signal.signal(s, _interrupt)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


class _Watchdog:
    """Ends the process when SIGTERM or SIGINT came during Ray's start and the main thread has not taken it up within
    `WATCHDOG_S`: a Python handler runs only between bytecodes, and Ray's start waits in C++ for seconds at a time
    (6 s measured on a loaded 2-core machine). It learns of the signal from the interpreter's wakeup fd, which the C
    handler writes whichever Python handler is set; it stops the processes started since `before`, exits 130."""

    def __init__(self, before: set[int]) -> None:
        self.before = before
        self._claimed = threading.Lock()
        self._done = threading.Event()
        self._old_fd = -1
        self._rx, self._tx = socket.socketpair()
        self._on = threading.current_thread() is threading.main_thread()  # set_wakeup_fd is the main thread's

    def __enter__(self) -> _Watchdog:
        if self._on:
            self._tx.setblocking(False)
            self._old_fd = signal.set_wakeup_fd(self._tx.fileno(), warn_on_full_buffer=False)
            threading.Thread(target=self._watch, name="ray-start-watchdog", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._on:
            signal.set_wakeup_fd(self._old_fd)
        self._tx.close()  # the watch ends on the EOF
        self._rx.close()

    def claim(self) -> bool:
        """True for the first of the main thread and the watchdog to stop Ray's start; the other leaves it be."""
        return self._claimed.acquire(blocking=False)

    def _watch(self) -> None:
        while data := self._recv():
            if self._old_fd >= 0:  # another's wakeup fd (an event loop's signal handlers) still hears of it
                with contextlib.suppress(OSError):
                    os.write(self._old_fd, data)
            if {signal.SIGTERM, signal.SIGINT} & set(data) and not self._done.wait(WATCHDOG_S) and self.claim():
                _kill_started(self.before)
                os._exit(EXIT_INTERRUPTED)

    def _recv(self) -> bytes:
        try:
            return self._rx.recv(64)
        except OSError:  # closed by __exit__
            return b""


def _stop_started(ray: Any, before: set[int]) -> None:
    """Stop a Ray start cut short: what `ray.shutdown` knows (a node whose start finished), then the processes started
    since `before`. Left alone, a raylet's agents outlived a SIGKILLed raylet by half a minute."""
    with contextlib.suppress(Exception):
        ray.shutdown()
    _kill_started(before)


def _kill_started(before: set[int]) -> None:
    """SIGTERM to the processes below this one that were not there `before` (a raylet takes its agents and workers
    with it), SIGKILL to those left after `STOP_GRACE_S`."""
    started = _descendants() - before
    for pid in started:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while (left := {pid for pid in started if _state(pid) not in "ZX"}) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _state(pid: int) -> str:
    """A process's state letter (Z: a zombie, done), "" when gone; /proc/PID/stat after "(comm)": state, ppid, …."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _descendants() -> set[int]:
    """The live processes below this one (read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] not in ("Z", "X"):
                children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [os.getpid()]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.add(kid)
            todo.append(kid)
    return out


def _join(ray: Any, address: str, timeout_s: float) -> None:
    """Join `address` (auto, host:port, ray://host:port) or raise PrerequisiteError once `timeout_s` has passed: its
    GCS (or client server) must accept a TCP connection, then `ray.init` must return, on a helper thread."""
    deadline = time.monotonic() + timeout_s
    target = _target(ray, address)
    host, port = _host_port(target)
    _probe(host, port, deadline, address, timeout_s)
    done, failed = threading.Event(), []

    def join() -> None:
        try:
            ray.init(address=address, **INIT_KWARGS)
        except BaseException as e:
            failed.append(e)
        finally:
            done.set()

    # tries of Ray's GCS connect loop (a second and more each, read as it runs): the thread gives up soon after us
    with _env_default(RAY_gcs_server_port_wait_time_s=str(max(1, int(deadline - time.monotonic())))), _quiet_ray():
        threading.Thread(target=join, name="ray-join", daemon=True).start()
        while not done.wait(max(0.0, min(0.2, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise _unreachable(address, target, timeout_s, "Ray did not finish joining")
    if failed:
        if isinstance(failed[0], ConnectionError):
            raise _unreachable(address, target, timeout_s, str(failed[0])) from failed[0]
        raise failed[0]


def _target(ray: Any, address: str) -> str:
    """The address `ray.init(address)` reaches: `auto` resolved as Ray does (RAY_ADDRESS, else its address file of the
    last `ray start`, else a GCS running on this machine)."""
    if address != "auto":
        return address
    if env := os.environ.get("RAY_ADDRESS"):
        return env
    try:
        return str(ray._private.services.canonicalize_bootstrap_address_or_die("auto"))
    except ConnectionError as e:
        raise PrerequisiteError(
            "placement.address=auto: no Ray cluster found on this machine (no RAY_ADDRESS, no address file of a "
            "`ray start`, no GCS running)",
            hint="start one (`ray start --head --port=6379`) or give its address: -c placement.address=HOST:6379",
        ) from e


def _host_port(target: str) -> tuple[str, int]:
    """The host and TCP port to probe for `target`: a GCS (host:port) or a Ray client server (ray://host[:port])."""
    client = target.startswith("ray://")
    parts = urlsplit(target if client else f"//{target}")
    try:
        port = parts.port or (CLIENT_PORT if client else None)
    except ValueError:  # not a number, or out of range
        port = None
    if not parts.hostname or port is None:
        raise UsageError(
            f"placement.address {target!r} is no Ray address",
            hint="give auto, HOST:PORT of the head's GCS (6379 by default) or ray://HOST:10001",
        )
    return parts.hostname, port


def _probe(host: str, port: int, deadline: float, address: str, timeout_s: float) -> None:
    """Wait until `host:port` accepts a TCP connection (a cluster still starting may come up), until `deadline`: an
    address nobody answers fails here, before Ray's client retries it for minutes."""
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(2.0, left))):
                return
        except OSError as e:
            why = f"{type(e).__name__}: {e}"
        left = deadline - time.monotonic()
        if left <= 0:
            raise _unreachable(address, f"[{host}]:{port}" if ":" in host else f"{host}:{port}", timeout_s, why)
        time.sleep(min(0.25, left))


def _unreachable(address: str, target: str, timeout_s: float, why: str) -> PrerequisiteError:
    where = address if address == target else f"{address} ({target})"
    return PrerequisiteError(
        f"no Ray cluster answered at {where} within {timeout_s:g} s: {why}",
        hint="start the cluster (`ray start --head --port=6379`), check placement.address, or raise "
        "placement.connect_timeout_s",
    )


@contextlib.contextmanager
def _env_default(**values: str) -> Iterator[None]:
    """These environment variables, where the user set none, set meanwhile (Ray reads them as it joins)."""
    unset = [k for k in values if k not in os.environ]
    os.environ.update({k: values[k] for k in unset})
    try:
        yield
    finally:
        for k in unset:
            os.environ.pop(k, None)


class _NoSigtermWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("SIGTERM handler is not set")


@contextlib.contextmanager
def _quiet_ray() -> Iterator[None]:
    """Without Ray's warning that a join off the main thread sets no SIGTERM handler: hrl keeps its own on purpose."""
    logger, quiet = logging.getLogger("ray._private.worker"), _NoSigtermWarning()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
