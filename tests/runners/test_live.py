"""`runners/live.py`: episodes run through `guarded_episode` inside `live_status` show in `<run>/live.json` with
their phase and starting version while they run, leave it when they end, and the file says how the run ended."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from hrl.runners.live import LIVE_FILE, live_status, phase, read_live
from hrl.runners.rollouts.episodes import Episode, Rollouts, guarded_episode


class GatedRollouts(Rollouts):
    """Episodes that enter the `agent` phase, then wait for the test to let them end (no trace file written)."""

    def __init__(self) -> None:
        self.gate, self.inside = asyncio.Event(), asyncio.Event()

    async def episode(self, ep: Episode, trace_file: Path) -> dict[str, Any]:
        phase("agent")
        self.inside.set()
        await self.gate.wait()
        return {"episode": ep.key}


def live(run: Path) -> dict[str, Any]:
    return json.loads((run / LIVE_FILE).read_text())


def test_an_episode_shows_while_it_runs_and_the_run_ends_finished(tmp_path):
    version = {"v": 4}

    async def main() -> None:
        rollouts = GatedRollouts()
        with live_status(tmp_path, lambda: version["v"], interval_s=0.05) as status:
            ep = Episode({"instance_id": "t1"}, 0, 7)
            task = asyncio.create_task(guarded_episode(rollouts, ep, tmp_path / "t.jsonl"))
            await rollouts.inside.wait()
            status.write("running")  # what the heartbeat writes next, now
            [entry] = live(tmp_path)["episodes"]
            assert (entry["episode"], entry["task"], entry["state"], entry["version"]) == ("it7:t1#0", "t1", "agent", 4)
            version["v"] = 5  # a publish while the episode runs: the episode keeps the version it started on
            status.write("running")
            data = read_live(tmp_path)
            assert data is not None and data["live"] and data["version"] == 5
            assert data["episodes"][0]["version"] == 4
            rollouts.gate.set()
            await task
            status.write("running")
            assert live(tmp_path)["episodes"] == []

    asyncio.run(main())
    data = read_live(tmp_path)
    assert data is not None and data["state"] == "finished" and not data["live"] and data["episodes"] == []


@pytest.mark.parametrize(("stop", "state"), [("raise", "failed"), ("cancel", "interrupted")])
def test_a_run_that_stops_says_how(tmp_path, stop, state):
    async def run() -> None:
        with live_status(tmp_path, lambda: 0, interval_s=0.05):
            if stop == "raise":
                raise RuntimeError("the trainer broke")
            await asyncio.sleep(3600)

    async def main() -> None:
        task = asyncio.create_task(run())
        await asyncio.sleep(0.1)
        if stop == "cancel":
            task.cancel()
        with pytest.raises((RuntimeError, asyncio.CancelledError)):
            await task

    asyncio.run(main())
    assert live(tmp_path)["state"] == state


def test_outside_a_live_run_the_hooks_do_nothing(tmp_path):
    rollouts = GatedRollouts()

    async def main() -> None:
        rollouts.gate.set()
        await guarded_episode(rollouts, Episode({"instance_id": "t1"}, 0, 0), tmp_path / "t.jsonl")

    asyncio.run(main())
    assert not (tmp_path / LIVE_FILE).exists() and read_live(tmp_path) is None
