"""browser-use's `Agent` on the episode's browser: the library's own loop, prompts and OpenAI client, in two forms.

- `--agent browser-use` (the CLI form, in a sandbox): hrl writes this file into the episode's HOME and runs it with
  the library's venv there, `python FILE BASE_URL MODEL STEPS VISION TASK`, the browser read from `browser.json` in
  the working directory.
- `--agent python:hrl.runners.agents.browser_use_agent:run` with `rollout.python: browser-use` (the white-box form):
  hrl's worker runs `run(task, session)` in the library's venv, given the session's URL, key and browser.

At module level it imports nothing of hrl (in the sandbox, hrl is not there) and nothing of browser-use (hrl's own
interpreter loads this module to find `run`, and has no browser-use).
"""

import asyncio
import json
import os
import sys


async def drive(base_url, model, api_key, cdp_url, task, max_steps=10, vision=False):
    """Run browser-use's Agent on `task` against the OpenAI-compatible endpoint `base_url`, in the browser whose
    DevTools endpoint is `cdp_url` (hrl's relay: the episode's own browser, stopped by hrl, not by the agent).
    Telemetry, cloud sync, planning and the LLM judge are off; no extra "final response" call past `max_steps`.
    Returns {done, steps, result}."""
    from browser_use import Agent, Browser
    from browser_use.llm.openai.chat import ChatOpenAI

    endpoint = "http://" + cdp_url.split("://", 1)[1].split("/", 1)[0]  # it reads /json/version there
    llm = ChatOpenAI(model=model, base_url=base_url, api_key=api_key, max_retries=0)
    browser = Browser(cdp_url=endpoint, keep_alive=True)
    agent = Agent(task=task, llm=llm, browser=browser, use_vision=vision, use_judge=False, directly_open_url=False,
                  enable_planning=False, calculate_cost=False, max_failures=2, final_response_after_failure=False,
                  enable_signal_handler=False)  # fmt: skip
    history = await agent.run(max_steps=int(max_steps))
    return {"done": history.is_done(), "steps": history.number_of_steps(), "result": history.final_result()}


async def run(task, session):
    """The white-box form: `rollout.agent_options.max_steps` (default 10), `.vision` (default false: set it only for
    a model that takes images). The page's reward is the verifier's; this returns nothing."""
    if session.browser is None:
        raise RuntimeError("browser-use needs a browser task (verifier miniwob): this episode has no browser")
    options = session.options
    await drive(session.base_url, session.model, session.api_key, session.browser["cdp_url"], task.problem_statement,
                max_steps=int(options.get("max_steps", 10)), vision=bool(options.get("vision", False)))  # fmt: skip


def main(argv):
    base, model, steps, vision, task = argv[:5]
    with open("browser.json") as f:
        cdp_url = json.load(f)["cdp_url"]
    out = asyncio.run(drive(base, model, os.environ["OPENAI_API_KEY"], cdp_url, task, int(steps), vision == "1"))
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
