"""The per-run sandbox pool on real local sandboxes (bubblewrap where it runs): warm sandboxes handed out and
cleaned up, never across specs; a group's sandbox reused after a reset that restores the task's start state, and a
broken reset caught by the state check."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from hrl.runners.metrics import step_metrics
from hrl.sandboxes import SandboxError, SandboxSpec
from hrl.sandboxes.local import PREFIX, SANDBOX_MARK, LocalBackend, bwrap_works
from hrl.sandboxes.pool import LocalReset, SandboxPool, spec_key
from tests.runners.tasks.test_verifier import mini_task, verifier
from tests.runners.test_metrics import trace as make_trace

SPEC = SandboxSpec(workdir="/work", network="none")


def _backend(root: Path, isolate: bool = True) -> LocalBackend:
    if isolate:
        assert bwrap_works(), "bubblewrap is needed (.ci/setup.sh installs it)"
    return LocalBackend(root=str(root), isolate=isolate)


def _left(root: Path) -> list[Path]:
    return list(root.glob(f"{PREFIX}*"))


async def _nothing(sandbox: Any) -> None:
    return None


def _marked(sandbox_id: str) -> int:
    """Live processes carrying the sandbox's mark in their environment (a zombie, killed and not yet reaped, is
    not live)."""
    mark, n = f"{SANDBOX_MARK}={sandbox_id}".encode(), 0
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark in environ.read_bytes().split(b"\0"):
                n += (environ.parent / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            continue
    return n


def test_warm_pool_hands_out_premade_sandboxes_and_removes_them_all_at_the_end(tmp_path: Path) -> None:
    async def main() -> None:
        pool = SandboxPool(_backend(tmp_path), f"test-{uuid.uuid4().hex[:8]}", warm=2)
        async with pool.lease(SPEC, "ep-0", prepare=_nothing) as first:
            # the pool learns the spec from its first episode, which waits for one of the two it then makes rather
            # than making a third beside them
            assert first.source == "pooled"
        await pool.settle()
        assert pool.held == 2 and pool.counts["warmed"] == 3 == pool.counts["created"]  # the two, and one refill
        made = pool.counts["created"]
        ids = []
        for k in (1, 2):
            async with pool.lease(SPEC, f"ep-{k}", prepare=_nothing) as lease:
                assert lease.source == "pooled"
                ids.append(lease.sandbox.id)
                assert (await lease.sandbox.exec("echo ok")).stdout == "ok\n"
        assert pool.counts["pooled"] == 3 and len(set(ids)) == 2  # the first episode's and these two
        assert pool.counts["created"] - made <= 2  # the refills, made in the background, not by the episodes
        await pool.settle()
        assert pool.held == 2 and len(_left(tmp_path)) == 2  # ready ones only: each episode's was closed
        await pool.close()
        assert pool.held == 0 and _left(tmp_path) == []
        with pytest.raises(SandboxError, match="closed"):
            async with pool.lease(SPEC, "late", prepare=_nothing):
                pass

    asyncio.run(main())


def test_a_pool_told_the_leases_to_come_makes_no_sandbox_past_the_last(tmp_path: Path) -> None:
    """`expect(n)`: a run of n episodes (warm 2) makes n sandboxes in all, not n + 2 refills nobody leases."""

    async def main() -> None:
        pool = SandboxPool(_backend(tmp_path), f"test-{uuid.uuid4().hex[:8]}", warm=2)
        pool.expect(3)
        for k in range(3):
            async with pool.lease(SPEC, f"ep-{k}", prepare=_nothing) as lease:
                assert lease.source == "pooled"
            await pool.settle()
        assert pool.counts["created"] == 3 and pool.held == 0 and _left(tmp_path) == []
        await pool.close()

    asyncio.run(main())


def test_a_spec_that_differs_never_gets_another_specs_sandbox(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    root = tmp_path / "sbx"
    other_specs = [
        SPEC.model_copy(update={"hidden_paths": [str(hidden)]}),
        SPEC.model_copy(update={"network": "host"}),
        SPEC.model_copy(update={"env": {"A": "1"}}),
        SPEC.model_copy(update={"image": "hrl/other:tag"}),
    ]
    assert len({spec_key(s) for s in [SPEC, *other_specs]}) == 5

    async def main() -> None:
        async with SandboxPool(_backend(root), f"test-{uuid.uuid4().hex[:8]}", warm=2) as pool:
            async with pool.lease(SPEC, "ep-0", prepare=_nothing):
                pass
            await pool.settle()
            pooled = {s.id for ready in pool._ready.values() for s in ready}
            assert len(pooled) == 2
            relabelled = SPEC.model_copy(update={"labels": {"hrl.task": "another"}})  # labels only name it
            async with pool.lease(relabelled, "ep-1", prepare=_nothing) as lease:
                assert lease.source == "pooled" and lease.sandbox.spec == SPEC  # type: ignore[attr-defined]
            await pool.settle()
            pooled = {s.id for ready in pool._ready.values() for s in ready}
            for k, spec in enumerate(other_specs):  # made for its own spec (by the pool, while it waited), never
                async with pool.lease(spec, f"other-{k}", prepare=_nothing) as lease:  # another spec's
                    assert lease.sandbox.id not in pooled
                    assert lease.sandbox.spec == spec  # type: ignore[attr-defined]
        assert _left(root) == []

    asyncio.run(main())


def test_a_first_batch_waits_for_the_sandboxes_being_made_instead_of_making_more(tmp_path: Path) -> None:
    """Eight episodes at once on a warm pool of eight that has just learnt their spec: the pool makes eight (plus
    the refills each take starts), not sixteen at once; every episode gets one of the eight."""

    async def main() -> None:
        backend = _backend(tmp_path)
        create, at_once, peak = backend.create, [0], [0]

        async def counted(*args: Any, **kwargs: Any) -> Any:
            at_once[0] += 1
            peak[0] = max(peak[0], at_once[0])
            try:
                return await create(*args, **kwargs)
            finally:
                at_once[0] -= 1

        backend.create = counted  # type: ignore[method-assign]
        async with SandboxPool(backend, f"test-{uuid.uuid4().hex[:8]}", warm=8) as pool:

            async def episode(k: int) -> str:
                async with pool.lease(SPEC, f"ep-{k}", prepare=_nothing) as lease:
                    return lease.source

            sources = await asyncio.gather(*(episode(k) for k in range(8)))
            assert sources == ["pooled"] * 8, sources
            assert peak[0] <= 8 + 1, peak  # the first batch, and a refill that may begin as one is handed out
        assert _left(tmp_path) == []

    asyncio.run(main())


@pytest.mark.parametrize("isolate", [True, False], ids=["bwrap", "plain"])
def test_reuse_gives_the_next_episode_of_a_group_the_first_ones_start(tmp_path: Path, isolate: bool) -> None:
    task = mini_task("local")
    grader = verifier("local")
    tmp = "/tmp" if isolate else "$HOME"  # unisolated, /tmp is the host's own: not the sandbox's to empty

    async def prepare(sandbox: Any) -> None:
        await grader.prepare(sandbox, task)

    async def main() -> None:
        pool = SandboxPool(_backend(tmp_path, isolate), f"test-{uuid.uuid4().hex[:8]}", reuse="group")
        async with pool.lease(SPEC, "g0-0", prepare=prepare, group="g0") as one:
            box = one.sandbox
            start = (await box.exec("git status --porcelain; cat mini/__init__.py; ls -A")).stdout
            work = await box.exec(
                "echo junk > left.txt && echo '# edit' >> mini/__init__.py && mkdir -p ro && chmod 500 ro "
                f"&& echo h > $HOME/h && echo t > {tmp}/t && (sleep 300 >/dev/null 2>&1 & echo $!)"
            )
            assert work.exit_code == 0, work.stderr
            if not isolate:  # bubblewrap ends it with the command's pid namespace; unisolated it outlives it
                assert await asyncio.to_thread(_marked, box.id) == 1
        async with pool.lease(SPEC, "g0-1", prepare=prepare, group="g0") as two:
            assert two.source == "reused" and two.sandbox is box and two.reset_s is not None
            root = Path(box.root)  # type: ignore[attr-defined]  # before any exec (bwrap makes mount points in tmp)
            assert not await asyncio.to_thread(lambda: [*(root / "home").iterdir(), *(root / "tmp").iterdir()])
            assert (await box.exec("git status --porcelain; cat mini/__init__.py; ls -A")).stdout == start
            assert (await box.exec(f"test ! -e {tmp}/t && find $HOME -mindepth 1")).stdout == ""
            assert await asyncio.to_thread(_marked, box.id) == 0
            assert set(two.metrics()) == {"sandbox_acquire_s", "sandbox_reset_s"}
        async with pool.lease(SPEC, "g1-0", prepare=prepare, group="g1") as other:
            assert other.source == "created" and other.sandbox is not box  # never across groups
        assert pool.counts["created"] == 2 and pool.counts["reused"] == 1 and pool.counts["reset_mismatch"] == 0
        await pool.close()
        assert _left(tmp_path) == []

    asyncio.run(main())


class _NoRestore(LocalReset):
    """A reset that forgets the workdir (HOME and tmp are still emptied): what the check is for."""

    async def restore(self, sandbox: Any) -> None:
        root = Path(sandbox.root)
        for folder in ("home", "tmp"):
            await asyncio.to_thread(shutil.rmtree, root / folder)
            await asyncio.to_thread((root / folder).mkdir)


def test_a_broken_reset_is_caught_counted_and_a_fresh_sandbox_used(tmp_path: Path) -> None:
    task = mini_task("local")
    grader = verifier("local")
    events: list[tuple[str, dict[str, Any]]] = []

    async def prepare(sandbox: Any) -> None:
        await grader.prepare(sandbox, task)

    async def main() -> None:
        pool = SandboxPool(
            _backend(tmp_path), f"test-{uuid.uuid4().hex[:8]}", reuse="group",
            on_event=lambda kind, data: events.append((kind, data)), reset_factory=lambda sandbox: _NoRestore(),
        )  # fmt: skip
        async with pool.lease(SPEC, "g-0", prepare=prepare, group="g") as one:
            first = one.sandbox
            await first.exec("echo junk > left.txt")
        async with pool.lease(SPEC, "g-1", prepare=prepare, group="g") as two:
            assert two.source == "created" and two.sandbox is not first and two.mismatches == 1
            assert (await two.sandbox.exec("ls left.txt")).exit_code != 0
            assert (await two.sandbox.exec("git status --porcelain")).stdout == ""
            assert two.metrics()["sandbox_reset_mismatch"] == 1
        assert not await asyncio.to_thread(Path(first.root).exists)  # type: ignore[attr-defined]
        assert pool.counts["reset_mismatch"] == 1 and [k for k, _ in events] == ["reset_mismatch"]
        await pool.close()
        assert _left(tmp_path) == []

    asyncio.run(main())


def test_step_metrics_carry_sandbox_and_harness_start_times_and_reset_mismatches() -> None:
    def trace(meta: dict[str, Any]) -> dict[str, Any]:
        return make_trace(uuid.uuid4().hex[:8], [], 0.0, 1.0, metadata=meta)

    traces = [trace({"sandbox_acquire_s": float(k)}) for k in range(4)]
    traces.append(trace({"sandbox_acquire_s": 0.5, "sandbox_reset_s": 0.25, "sandbox_reset_mismatch": 2,
                         "harness_start_s": 3.5}))  # fmt: skip
    out = step_metrics(traces)
    # linear-interpolated percentiles of [0, 0.5, 1, 2, 3]: p50 is the middle value; p95 sits at index
    # 0.95 * 4 = 3.8, so 2 + 0.8 * (3 - 2) = 2.8, up to a few float64 eps (2.2e-16 each) of rounding
    assert out["trace/sandbox_acquire_s/p50"] == 1.0
    assert out["trace/sandbox_acquire_s/p95"] == pytest.approx(2.8, abs=1e-12)
    assert out["trace/sandbox_reset_s"] == 0.25 and out["trace/harness_start_s/p50"] == 3.5
    assert out["rollout/reset_mismatch"] == 2.0
    assert "rollout/reset_mismatch" not in step_metrics([trace({})])  # no pool said anything: no metric


def test_reuse_is_refused_where_the_grade_would_see_the_whole_reused_container() -> None:
    """A Harbor verifier with carry: container grades the agent's committed container, files outside the workdir
    too: a reused one would carry the previous episode's into the next one's grade. (The docker backend object is
    made, never connected: no daemon is asked anything.)"""
    from hrl.errors import UsageError
    from hrl.runners.rollouts.rollout import AgentRollouts, RolloutConfig

    cfg = RolloutConfig(agent="mini-swe-agent", sandbox="docker", reuse="group")
    with pytest.raises(UsageError, match="carry: container") as refused:
        AgentRollouts(None, cfg, verifier={"name": "harbor"})  # type: ignore[arg-type]
    assert "carry: workdir" in (refused.value.hint or "")
    assert AgentRollouts(None, cfg, verifier={"name": "harbor", "carry": "workdir"}).pool.reuse == "group"  # type: ignore[arg-type]


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_docker_reuse_resets_through_exec_and_a_broken_reset_is_caught(swe_image: str) -> None:
    """The same reset in a container (`ExecReset`: tar, /proc, find): the second episode of a group finds the
    first one's start, with what ran before the snapshot (the relay to the proxy) still running; a reset that forgets
    the workdir is counted and replaced; nothing is left after close."""
    import docker

    from hrl.sandboxes.docker import DockerBackend
    from hrl.sandboxes.pool import ExecReset

    task = mini_task("docker")
    grader = verifier("docker")
    spec = grader.sandbox_spec(task)
    rid = f"test-{uuid.uuid4().hex[:8]}"
    look = "git status --porcelain; cat mini/__init__.py; ls -A; ls -A /tmp"

    class NoRestore(ExecReset):
        async def restore(self, sandbox: Any) -> None:
            await self._run(sandbox, "rm -rf /tmp/hrl-home-*")

    async def prepare(sandbox: Any) -> None:
        await grader.prepare(sandbox, task)
        # running before the snapshot, from an exec of its own, as hrl's relay to the proxy is: kept by every reset
        assert (await sandbox.exec("(sleep 301 >/dev/null 2>&1 &)")).exit_code == 0

    async def main() -> None:
        backend = DockerBackend()
        pool = SandboxPool(backend, rid, reuse="group")
        async with pool.lease(spec, "g-0", prepare=prepare, group="g") as one:
            box = one.sandbox
            start = (await box.exec(look)).stdout
            work = await box.exec(
                "echo junk > left.txt && echo '# edit' >> mini/__init__.py && mkdir -p /tmp/hrl-home-x "
                "&& echo h > /tmp/hrl-home-x/h && (sleep 300 >/dev/null 2>&1 &)"
            )
            assert work.exit_code == 0, work.stderr
            assert "sleep 300" in (await box.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '")).stdout
        async with pool.lease(spec, "g-1", prepare=prepare, group="g") as two:
            assert two.source == "reused" and two.sandbox is box and two.reset_s is not None
            assert (await box.exec(look)).stdout == start
            running = (await box.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '")).stdout
            assert "sleep 300" not in running and "sleep 301" in running
        await pool.close()
        broken = SandboxPool(backend, rid, reuse="group", reset_factory=lambda sandbox: NoRestore())
        async with broken.lease(spec, "b-0", prepare=prepare, group="b") as one:
            await one.sandbox.exec("echo junk > left.txt")
        async with broken.lease(spec, "b-1", prepare=prepare, group="b") as two:
            assert two.source == "created" and two.sandbox is not one.sandbox and two.mismatches == 1
            assert (await two.sandbox.exec("ls left.txt")).exit_code != 0
        await broken.close()

    asyncio.run(main())
    left = docker.from_env().containers.list(all=True, filters={"label": f"hrl.run={rid}"}, ignore_removed=True)
    assert left == []


def test_a_pool_closed_while_a_sandbox_made_ahead_is_set_up_removes_that_sandbox(tmp_path: Path) -> None:
    """A run's stop closes the pool while a sandbox made ahead is still being set up (its warm harness written in):
    that sandbox is nobody's yet, so the pool closes it rather than leave it behind."""

    async def main() -> None:
        setting_up = asyncio.Event()

        async def slow_setup(sandbox: Any) -> None:
            setting_up.set()
            await asyncio.sleep(3600)

        pool = SandboxPool(_backend(tmp_path, isolate=False), f"test-{uuid.uuid4().hex[:8]}", warm=1,
                           on_made=slow_setup)  # fmt: skip

        async def episode() -> None:
            async with pool.lease(SPEC, "ep-0", prepare=_nothing):
                pass

        waiting = asyncio.create_task(episode())  # waits for the sandbox being made ahead
        await asyncio.wait_for(setting_up.wait(), 60)
        waiting.cancel()  # the stop: episodes first, then the pool
        await asyncio.gather(waiting, return_exceptions=True)
        await pool.close()

    asyncio.run(main())
    assert _left(tmp_path) == []


def test_closing_a_warm_sandbox_ends_its_launcher_off_the_event_loop(tmp_path: Path, monkeypatch) -> None:
    """A warm harness's launcher ends with its sandbox's close, which kills off the event loop. Cancelling the
    launcher's command first killed it on the event loop (a local sandbox scans /proc), one warm sandbox after
    another when a run stops: seconds of a stop on a loaded machine."""
    import sys
    import threading
    from types import SimpleNamespace

    import hrl.sandboxes.local as local
    from hrl.runners.agents.install import AgentInstall
    from hrl.runners.agents.warm import start_warm_harness
    from hrl.sandboxes.pool import close_sandbox

    on_loop: list[str] = []
    real = local.kill_marked

    def spy(name: str, value: str) -> int:
        if threading.current_thread() is threading.main_thread():
            on_loop.append(name)
        return real(name, value)

    monkeypatch.setattr(local, "kill_marked", spy)
    runner = SimpleNamespace(name="fake", warm_imports=("json",), warm_env={}, package_kind="pypi", needs_tty=False)
    install = AgentInstall("fake", "0", "local", "", (str(Path(sys.executable).parent),), (), "")

    async def main() -> None:
        sandbox = await _backend(tmp_path, isolate=False).create(SPEC, "test-warm-close", "ep")
        warm = await start_warm_harness(sandbox, runner, install)  # type: ignore[arg-type]
        assert warm is not None and warm.task is not None
        for _ in range(600):  # the launcher is up once its socket appears
            if await asyncio.to_thread(Path(sandbox.host_path(warm.socket)).exists):
                break
            await asyncio.sleep(0.05)
        await close_sandbox(sandbox)
        assert warm.task.done()

    asyncio.run(main())
    assert on_loop == [] and _left(tmp_path) == []
