"""A fleet hrl does not run: mini-swe-agent on the demo's tasks against an online hrl run, graded here, rewarded over
HTTP, some rewards late. The run is reached through its two URLs only: the client routes (`POST /sessions`,
`/s/<token>/end`, `/s/<token>/reward`) and the OpenAI-compatible endpoint each session's `base_url` names. The agent
and the tests it may have rewritten run in hrl's local sandboxes (`hrl.sandboxes`), not on this host as you: see
docs/online.md and docs/security.md.

    hrl keys add fleet --run-dir runs/online > fleet.key
    hrl train --recipe demo --serve --port 8100 --run-dir runs/online &
    python examples/online/fleet.py --url http://127.0.0.1:8100 --key "$(cat fleet.key)" \\
        --tasks recipes/demo/tasks.jsonl --mini "$(command -v mini)"

Each round takes `--tasks-per-round` tasks and runs `--group-size` episodes of each as one group (all its sessions
opened before any ends, so the run takes the group whole). An episode: the task's files in a fresh local sandbox,
`mini` run there pointed at the session, then the task's tests (its test patch, FAIL_TO_PASS and PASS_TO_PASS) on
what it left, in a second sandbox with no network; reward 1 when they all pass, else 0. A `--late-share` of the
episodes end without a reward and post it `--late-s` seconds later. Where bubblewrap runs, each sandbox sees the
host's files read-only, its own HOME and temp folder, no host variable but an allowlist (no cloud key, no client
key), and none of hrl's control tokens or run directories; the agent's keeps the host's network, to reach the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hrl.sandboxes import Sandbox, SandboxSpec
from hrl.sandboxes.local import LocalBackend

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]


def call(url: str, path: str, key: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """POST `body` to the run with the client key; the JSON answer (an HTTP error raises, with its message)."""
    req = urllib.request.Request(url + path, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def served_model(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as resp:
        return str(json.loads(resp.read())["data"][0]["id"])


async def run_mini(args: argparse.Namespace, task: dict[str, Any], session: dict[str, Any], model: str) -> float:
    """mini-swe-agent on the task in a local sandbox, its model the session's endpoint (as hrl's own runner starts
    it); then the task's tests on what it left, in a sandbox of their own with no network. The reward."""
    backend = LocalBackend()
    env = {"OPENAI_API_KEY": f"hrl-{session['token']}", "MSWEA_CONFIGURED": "true", "MSWEA_SILENT_STARTUP": "1",
           "MSWEA_COST_TRACKING": "ignore_errors", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # fmt: skip
    async with await backend.create(SandboxSpec(network="host", env=env), "fleet", session["token"]) as agent:
        for name, text in task["repo_snapshot"].items():
            await agent.write_file(name, text.encode())
        cmd = [args.mini, "-m", f"openai/{model}", "-t", task["problem_statement"], "--yolo", "--exit-immediately",
               "-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={session['base_url']}",
               "-c", f"agent.step_limit={args.step_limit}"]  # fmt: skip
        await agent.exec(cmd, timeout_s=args.timeout_s)  # a timeout: graded as it stands
        async with await backend.create(SandboxSpec(network="none"), "fleet", "grade") as grader:
            await grader.copy_in(agent.host_path("."), ".")
            return await grade(grader, task)


async def grade(sandbox: Sandbox, task: dict[str, Any]) -> float:
    """The task's tests on what the agent left: 1.0 when every FAIL_TO_PASS and PASS_TO_PASS test passes."""
    await sandbox.write_file(".fleet-test.patch", task["test_patch"].encode())
    if (await sandbox.exec(["git", "apply", ".fleet-test.patch"], timeout_s=60)).exit_code != 0:
        return 0.0
    result = await sandbox.exec([*PYTEST, *task["FAIL_TO_PASS"], *task["PASS_TO_PASS"]], timeout_s=120)
    return 1.0 if result.exit_code == 0 else 0.0


def episode(args: argparse.Namespace, task: dict[str, Any], session: dict[str, Any], model: str, late: bool) -> float:
    reward = asyncio.run(run_mini(args, task, session, model))
    path = f"/s/{session['token']}"
    if not late:
        call(args.url, path + "/end", args.key, {"reward": reward, "info": {"graded_by": "fleet"}})
        return reward
    call(args.url, path + "/end", args.key)  # the trace waits for its reward
    threading.Timer(args.late_s, lambda: _late(args, path, reward)).start()
    return reward


def _late(args: argparse.Namespace, path: str, reward: float) -> None:
    try:
        answer = call(
            args.url, path + "/reward", args.key, {"reward": reward, "info": {"graded_by": "fleet", "late": True}}
        )
        print(f"late reward {reward} for {path}: {answer}", file=sys.stderr)
    except (urllib.error.URLError, OSError) as e:
        print(f"late reward for {path} not posted: {e}", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description="mini-swe-agent against an online hrl run, graded and rewarded here.")
    ap.add_argument("--url", required=True, help="The run's address (hrl train --serve --host/--port).")
    ap.add_argument("--key", default=os.environ.get("HRL_CLIENT_KEY", ""), help="A client key (hrl keys add).")
    ap.add_argument("--tasks", default="recipes/demo/tasks.jsonl", help="SWE-bench-style JSONL with repo_snapshot.")
    ap.add_argument("--mini", default="mini", help="The mini-swe-agent CLI.")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--tasks-per-round", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--step-limit", type=int, default=5)
    ap.add_argument("--timeout-s", type=float, default=180)
    ap.add_argument("--late-share", type=float, default=0.25, help="Episodes whose reward is posted late.")
    ap.add_argument("--late-s", type=float, default=5.0, help="How late (seconds after the end).")
    ap.add_argument("--rounds", type=int, default=0, help="0 = until the run stops answering.")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not args.key:
        ap.error("give --key (or HRL_CLIENT_KEY): `hrl keys add NAME --run-dir RUN` prints one")
    tasks = [json.loads(line) for line in Path(args.tasks).read_text().splitlines() if line.strip()]
    rng, model, done = random.Random(args.seed), served_model(args.url), 0
    with ThreadPoolExecutor(args.concurrency) as pool:
        for r in range(args.rounds or 1 << 30):
            try:
                jobs = []
                for task in rng.sample(tasks, args.tasks_per_round):
                    group = f"r{r}-{task['instance_id']}"
                    sessions = [call(args.url, "/sessions", args.key, {"task_id": task["instance_id"], "group": group})
                                for _ in range(args.group_size)]  # fmt: skip
                    jobs += [
                        pool.submit(episode, args, task, s, model, rng.random() < args.late_share) for s in sessions
                    ]
                rewards = [j.result() for j in jobs]
            except (urllib.error.URLError, OSError) as e:
                print(f"the run stopped answering ({e}): done after {done} episodes", file=sys.stderr)
                return 0
            done += len(rewards)
            print(f"round {r}: {len(rewards)} episodes, mean reward {sum(rewards) / len(rewards):.3f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
