"""Harbor tasks whose environment serves a web app (`[browser]` in task.toml): the app started in the agent's
container, reached from the host only through the container's tunnel (`SandboxSpec.exposes`), the episode's browser
on its page with its endpoint forwarded into the container, and the task's own tests grading what the app recorded.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
from pathlib import Path

import pytest

from hrl.runners.agents import get_agent
from hrl.runners.browser import CDP
from hrl.runners.errors import UsageError
from hrl.runners.tasks.harbor import load_harbor_tasks
from hrl.runners.tasks.harbor_verifier import HarborVerifier, browser_of
from hrl.runners.tasks.task import TaskFormatError
from hrl.sandboxes import SandboxSpec, get_backend
from tests.conftest import covering, install_agent
from tests.harbor_tasks import write_web_task
from tests.runners.agents.test_browser_agents import hrl, running_under


def test_the_browser_table_is_read_and_checked(tmp_path: Path):
    task = load_harbor_tasks(write_web_task(tmp_path))[0]
    assert browser_of(task) is not None and (browser_of(task).port, browser_of(task).path) == (8080, "/")
    assert browser_of(type(task).model_validate(task.model_dump())) == browser_of(task)  # through a dict
    toml = tmp_path / "web-order" / "task.toml"
    toml.write_text(toml.read_text().replace("port = 8080", "prot = 8080"))
    with pytest.raises(TaskFormatError, match="browser"):
        load_harbor_tasks(tmp_path / "web-order")


def test_a_local_sandbox_without_bubblewrap_refuses_to_expose_a_port(tmp_path: Path):
    from hrl.sandboxes import SandboxError
    from hrl.sandboxes.local import LocalBackend

    spec = SandboxSpec(workdir=str(tmp_path), network="none", exposes={8080: str(tmp_path / "app.sock")})
    with pytest.raises(SandboxError, match="only in a network namespace of its own"):
        asyncio.run(LocalBackend(root=str(tmp_path / "boxes"), isolate=False).create(spec, "hrl-test", "expose"))


def test_an_agent_without_a_browser_is_refused_before_anything_starts(tmp_path: Path):
    from hrl.runners.preflight import check_web_apps

    tasks = load_harbor_tasks(write_web_task(tmp_path / "web"))
    for agent in ("aider", "mini-swe-agent", "python:agent.py:run"):
        with pytest.raises(UsageError, match="web app"):
            check_web_apps([agent], tasks)
    check_web_apps(["claude-code", "browser-use"], tasks)


@pytest.mark.docker
@pytest.mark.browser
@pytest.mark.parametrize("where", ["sandbox", "host"])
def test_the_browser_reaches_the_app_only_through_the_containers_tunnel(tmp_path: Path, where: str):
    """The agent's container has no network; its app reaches the episode's browser through the tunnel, the page's
    GET and a POST from the page's own script both arrive, and the app records the POST in the container. The
    browser runs in a container of its own (docker: the page is the app's own port there, as in the agent's
    container) or beside hrl (host). The agent's container sees the browser's endpoint as 127.0.0.1:9222."""
    import docker

    task = load_harbor_tasks(write_web_task(tmp_path))[0]
    run_id = f"hrl-test-web-{where}"
    verifier = HarborVerifier(get_backend("docker"), run_id=run_id, keep_final=False, browser=where)
    mine = ["hrl.browser=1", f"hrl.run={run_id}"]

    async def main() -> tuple[dict, list, str, object, list]:
        await verifier.provision(task)
        spec = verifier.episode_spec(task)
        assert spec.network == "none" and set(spec.exposes) == {8080} and set(spec.forwards) == {9222}
        async with await verifier.backend.create(spec, run_id, "web") as sandbox:
            await verifier.prepare(sandbox, task)
            info = json.loads(await sandbox.read_file("/app/browser.json"))
            browsers = [c.name for c in docker.from_env().containers.list(filters={"label": mine})]
            cdp = await CDP.connect(verifier._browsers[sandbox.id][1].direct_url)
            (page,) = [t for t in (await cdp.call("Target.getTargets"))["targetInfos"] if t["type"] == "page"]
            session = (await cdp.call("Target.attachToTarget", targetId=page["targetId"], flatten=True))["sessionId"]
            seen = []
            for script in ("document.body.innerText", "fetch('/confirm', {method: 'POST'}).then(r => r.text())"):
                reply = await cdp.call("Runtime.evaluate", session, expression=script, awaitPromise=True,
                                       returnByValue=True)  # fmt: skip
                seen.append(reply["result"].get("value"))
            await cdp.close()
            read = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9222/json/version').read().decode())"
            inside = await sandbox.exec(["python3", "-c", read])
            folder = Path(spec.forwards[9222]).parent
            verdict = await verifier.verify(sandbox, task)
            await verifier.release(sandbox)
            assert not folder.exists()  # the episode's socket folder
        await verifier.close()
        left = [c.name for c in docker.from_env().containers.list(all=True, filters={"label": mine})]
        return info, seen, inside.stdout, verdict, [browsers, left]

    info, seen, inside, verdict, (browsers, left) = asyncio.run(main())
    assert info["cdp_url"].startswith("ws://127.0.0.1:9222/devtools/browser/") and "webSocketDebuggerUrl" in inside
    if where == "sandbox":
        assert info["page_url"] == "http://127.0.0.1:8080/" and len(browsers) == 1
    else:
        assert info["page_url"].startswith("http://127.0.0.1:") and browsers == []
    assert "Confirm order" in seen[0] and "Order confirmed." in seen[1], seen
    assert verdict.reward == 1.0, verdict.reward_info  # the app's record, graded in a fresh container
    assert verdict.reward_info["browser"] == {"blocked_requests": [], "refused_commands": []}
    assert verifier._folders.root is None and left == []


@pytest.mark.docker
def test_an_app_that_never_answers_is_a_sandbox_error_not_a_zero(tmp_path: Path):
    folder = write_web_task(tmp_path)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace('start = "python3 /srv/app.py"', 'start = "sleep 600"')
                    .replace("ready_timeout_sec = 30.0", "ready_timeout_sec = 3.0"))  # fmt: skip
    task = load_harbor_tasks(folder)[0]
    verifier = HarborVerifier(get_backend("docker"), run_id="hrl-test-web", keep_final=False)

    async def main() -> None:
        from hrl.sandboxes import SandboxError

        await verifier.provision(task)
        async with await verifier.backend.create(verifier.episode_spec(task), "hrl-test-web", "dead") as sandbox:
            with pytest.raises(SandboxError, match="did not answer"):
                await verifier.prepare(sandbox, task)
            await verifier.release(sandbox)
        await verifier.close()

    asyncio.run(main())


def _web_turns(name: str) -> list[object]:
    """Snapshot the shop's page, click Confirm order by the ref the snapshot gave it, finish."""
    runner = get_agent(name)
    tool = runner.mcp_tool.format(server="playwright", tool="{}")  # type: ignore[union-attr]
    ref = '{{match:button "Confirm order" \\[ref=(e\\d+)\\]}}'  # the button's ref in the last snapshot
    turns: list[object] = [
        {"tool_calls": [{"name": tool.format("browser_snapshot"), "arguments": {}}]},
        {
            "tool_calls": [
                {"name": tool.format("browser_click"), "arguments": {"element": "Confirm order", "target": ref}}
            ]
        },
        "Done.",
    ]
    return [turns[0]] * (len(runner.smoke_turns("f", "t")) - 2) + turns


@pytest.mark.agents
@pytest.mark.docker
@pytest.mark.browser
@pytest.mark.timeout(900)
# claude-code's MCP browser is covered in CI by tests/runners/agents/test_browser_agents.py
@pytest.mark.parametrize("name", covering(["claude-code", "codex"], full=["claude-code"]))
def test_a_cli_confirms_the_order_in_the_apps_page_and_the_tests_grade_it(name: str, tmp_path: Path):
    """`hrl rollout --tasks DIR --agent CLI --sandbox docker`: the CLI's MCP browser server clicks the app's button;
    the app (in the container) records it and test.sh scores it 1. An agent that does nothing scores 0 (a second
    run whose model only answers). Nothing is left: no container, browser or socket folder."""
    install_agent(name, "docker")
    write_web_task(tmp_path / "web")
    tmp = Path(tempfile.mkdtemp(prefix="hrl-t-", dir="/tmp"))
    run_id = f"hrl-web-{name}"
    for turns, want in ((_web_turns(name), 1.0), (["Done."] * 4, 0.0)):
        out = f"traces-{int(want)}.jsonl"
        run = hrl("rollout", "--tasks", "web", "--agent", name, "--sandbox", "docker", "--limit", "1",
                  "--model", "hrl:tiny", "--engine", "scripted", "-c", f"engine_options.turns={json.dumps(turns)}",
                  "-c", "engine_options.max_model_len=1048576", "-c", "proxy.default_max_tokens=512",
                  "-c", "rollout.agent_options.context_tokens=200000", "-c", "verifier.keep_final=false",
                  "--run-id", run_id, "--out", out, cwd=tmp_path, tmp=tmp)  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        (trace,) = [json.loads(line) for line in (tmp_path / out).read_text().splitlines()]
        assert trace["task_id"] == "web-order"
        assert (trace["reward"], trace["failure_reason"]) == (want, None), (trace["reward_info"], trace["metadata"])
        assert trace["reward_info"]["browser"]["blocked_requests"] == []
    shown = hrl("inspect", "traces-1.jsonl", cwd=tmp_path)
    click = get_agent(name).mcp_tool.format(server="playwright", tool="browser_click")  # type: ignore[union-attr]
    assert f"tool call {click} " in shown.stdout
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=hrl.run={run_id}"], capture_output=True,
                          text=True, check=True)  # fmt: skip
    assert left.stdout.strip() == ""
    assert running_under(tmp) == []
    assert list(tmp.iterdir()) == []
    tmp.rmdir()


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_the_web_task_validates(tmp_path: Path):
    """`hrl tasks validate DIR`: solve.sh records the order (1), the untouched environment does not (0)."""
    write_web_task(tmp_path / "web")
    run = hrl("tasks", "validate", "web", "--json", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    (row,) = json.loads(run.stdout)
    assert row["ok"] and (row["gold"]["reward"], row["empty"]["reward"]) == (1.0, 0.0), row
