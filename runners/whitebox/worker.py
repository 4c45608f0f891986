"""The subprocess side of `rollout.mode: subprocess`: `python -m hrl.runners.whitebox.worker SPEC [BASE_DIR]`.

Reads the task (JSON) on stdin or from $HRL_TASK_FILE, builds the session from the environment the harness set
(OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL, HRL_URL, HRL_SESSION_TOKEN, HRL_AGENT_KEY, HRL_AGENT_OPTIONS, and
HRL_BROWSER on a browser task, beside an allowlist of the host's variables: no control token reaches this process),
calls `SPEC(task, session)` (a plain or an async function) and prints
`HRL_RESULT {"returned": …, "reward": …, "reward_info": …}` as its last line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from hrl.runners.tasks.task import Task
from hrl.runners.whitebox.client import WhiteboxSession
from hrl.runners.whitebox.harness import RESULT_MARK, call_maybe_async, load_function


def session_from_env() -> WhiteboxSession:
    env = os.environ
    ws = WhiteboxSession(env["HRL_URL"], env["HRL_SESSION_TOKEN"], env["HRL_MODEL"], env.get("HRL_AGENT_KEY"))
    if env.get("HRL_BROWSER"):  # a browser task's browser, as this process reaches it
        ws.browser = json.loads(env["HRL_BROWSER"])
    ws.options = json.loads(env.get("HRL_AGENT_OPTIONS") or "{}")
    return ws


def read_task() -> Task:
    task_file = os.environ.get("HRL_TASK_FILE")  # a namespaced worker gets the task in a file, not on stdin
    return Task.model_validate_json(Path(task_file).read_text() if task_file else sys.stdin.read())


async def _main(spec: str, base_dir: str, task: Task) -> dict[str, Any]:
    fn = load_function(spec, base_dir or None)
    ws = session_from_env()
    ws.task = task
    try:
        with ws._current():
            returned = await call_maybe_async(fn, task, ws)
    finally:
        await ws._close_clients()
    return {"returned": returned, "reward": ws.reward_value, "reward_info": ws.reward_info}


if __name__ == "__main__":
    result = asyncio.run(_main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "", read_task()))
    sys.stdout.write("\n" + RESULT_MARK + json.dumps(result) + "\n")
