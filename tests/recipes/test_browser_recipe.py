"""The bundled browser recipe end to end: the real proxy and harness, hrl's Chromium on a MiniWoB++ page, the
Playwright agent acting on the scripted engine's replies; the page's own reward lands in the one trace."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest

from hrl.recipes.loader import load_recipe
from hrl.runners.browser import live_in_group
from hrl.runners.rollouts.episodes import Episode
from hrl.runners.rollouts.rollout import RolloutConfig, make_rollouts
from hrl.runners.serving.stack import serving
from hrl.runners.tasks.load import load_tasks
from hrl.runners.trace import read_traces
from hrl.sandboxes.local import SANDBOX_MARK, bwrap_works

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]


def marked(name: str, value: str) -> list[int]:
    """The processes whose environment holds name=value."""
    found, mark = [], f"{name}={value}".encode()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def _episode(model: str, turns: list, tmp_path: Path, mode: str = "auto", task=None) -> dict:
    cfg = load_recipe("browser")
    task = task or load_tasks(cfg["tasks"])[0]  # miniwob.click-test.s0: one "Click Me!" button
    out = tmp_path / "traces.jsonl"
    started: list[int] = []

    async def main() -> dict:
        async with serving(model, "scripted", engine_options={"turns": turns},
                           control_token=secrets.token_urlsafe(32)) as stack:  # fmt: skip
            config = RolloutConfig(**{**cfg["rollout"], "sandbox": "local", "mode": mode})
            rollouts = make_rollouts(stack, config, verifier=cfg["verifier"], base_dir=cfg["recipe_dir"])
            rollouts.prepare()  # loads the agent and makes the verifier
            prepare = rollouts.verifier.prepare

            async def spy(sandbox, task):  # the browser's sandbox (or process group), to check it is gone afterwards
                await prepare(sandbox, task)
                browser = rollouts.verifier._episodes[sandbox.id].browser
                started.append(browser.sandbox_id or browser.pid)

            rollouts.verifier.prepare = spy
            return await rollouts.episode(Episode(task, 0, 0), out)

    trace = asyncio.run(main())
    assert [t["trace_id"] for t in read_traces(out)] == [trace["trace_id"]]
    (where,) = started  # local with bubblewrap: the browser runs in a sandbox of its own, else beside hrl
    assert isinstance(where, str) == bwrap_works(), where
    assert not (marked(SANDBOX_MARK, where) if isinstance(where, str) else live_in_group(where))  # none left
    return trace


def test_a_click_on_the_right_button_scores_the_pages_reward(tiny_model, tmp_path):
    trace = _episode(tiny_model, ["click Click Me!", "done"], tmp_path)
    assert trace["failure_reason"] is None, trace.get("metadata")
    assert trace["reward"] == 1.0 and trace["success"] is True
    assert trace["reward_info"]["ended"] is True and trace["reward_info"]["tampered"] is False
    assert len(trace["calls"]) >= 1


def _click_button(seed: int):
    """click-button at `seed`; seed 2 asks for "Yes" among the buttons "Yes", "cancel" and "previous", seed 4 for
    "Okay" beside "Submit"; the instruction (`Click on the "Yes" button.`) comes before the buttons."""
    (task,) = load_tasks("miniwob:click-button")
    return task.model_copy(update={"instance_id": f"miniwob.click-button.s{seed}", "seed": seed})


@pytest.mark.parametrize(("seed", "reply", "reward"), [(2, "click yes", 1.0), (4, "click ok", 0.0),
                                                     (2, "click Yes</div> <b>", 0.0)])  # fmt: skip
def test_a_click_names_a_control_in_any_case_but_whole(tiny_model, tmp_path, seed, reply, reward):
    """`click yes` is the button "Yes" (it used to fall through to the text and click the instruction, which holds
    "Yes" too); `click ok` is no control on a page whose button is "Okay"; a name with a "/" in it (a model's stray
    markup) is no control either, not a crash of the agent (its pattern once broke Playwright's selector)."""
    trace = _episode(tiny_model, [reply, "done"], tmp_path, task=_click_button(seed))
    assert trace["failure_reason"] is None, trace.get("metadata")
    assert trace["reward"] == reward, trace["reward_info"]


def test_an_agent_that_does_nothing_scores_zero(tiny_model, tmp_path):
    trace = _episode(tiny_model, ["done"], tmp_path)
    assert trace["failure_reason"] is None, trace.get("metadata")
    assert trace["reward"] == 0.0 and trace["success"] is False and trace["reward_info"]["ended"] is False


def test_the_agent_in_a_closed_subprocess_reaches_the_browser_through_its_forward(tiny_model, tmp_path):
    """rollout.mode: subprocess: the agent's process is closed in a namespace of its own where bubblewrap runs, and
    session.browser is the episode's browser as that process reaches it (forwarded in); the click still scores 1."""
    trace = _episode(tiny_model, ["click Click Me!", "done"], tmp_path, mode="subprocess")
    assert trace["failure_reason"] is None, trace.get("metadata")
    assert trace["agent"]["version"] == "subprocess"
    assert trace["reward"] == 1.0 and trace["success"] is True
