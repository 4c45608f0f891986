"""What checking a task found (`TaskCheck`): the one result of `hrl tasks validate` for every kind of task, made by
`validate.check_task`, `harbor_verifier.check_harbor_task` and `miniwob.check_miniwob_task`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hrl.runners.tasks.verifier import Verdict

__all__ = ["TaskCheck"]


@dataclass
class TaskCheck:
    instance_id: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    gold: Verdict | None = None  # grading of the gold patch
    empty: Verdict | None = None  # grading of an empty diff
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        def brief(v: Verdict | None) -> dict[str, Any] | None:
            if v is None:
                return None
            keys = ("fail_to_pass", "pass_to_pass", "error", "timeout", "failed", "reward_file", "grading_s")
            info: dict[str, Any] = {k: v.reward_info[k] for k in keys if k in v.reward_info}
            return {"reward": v.reward, "failure_reason": v.failure_reason, **info}

        return {
            "instance_id": self.instance_id, "ok": self.ok, "problems": self.problems,
            "gold": brief(self.gold), "empty": brief(self.empty), "seconds": round(self.seconds, 2),
        }  # fmt: skip
