"""The verifier of the white-box arithmetic recipes (langgraph-react, agents-sdk, multi-agent): 1.0 when the
agent's last answer ends with the task's number, 0.1 when it ends with another number (format credit: a random tiny
model gets some reward variance to learn from), else 0. The reward is shaped, so success is said apart: the right
number, whatever the credit."""

from __future__ import annotations

import re
from typing import Any


def score(task: Any, answer: str) -> tuple[float, dict[str, Any], bool]:
    numbers = re.findall(r"-?\d+", answer or "")
    got = numbers[-1] if numbers else None
    solved = got == str(task.answer)
    reward = 1.0 if solved else 0.1 if got is not None else 0.0
    return reward, {"expected": str(task.answer), "got": got}, solved
