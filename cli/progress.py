"""A training run's progress on stderr: a line per step and per event of the loop, and the run's summary at its end
(the reward curve, the held-out table)."""

from __future__ import annotations

from typing import Any

from hrl.cli.output import say

__all__ = ["step_printer", "summary"]


def _reward(m: dict[str, Any]) -> str:
    """The step's mean reward over the traces that have one ('-' when none has: all failed in the infrastructure)."""
    value = m.get("trace/reward")
    return "  -  " if value is None else f"{value:.3f}"


def _line(m: dict[str, Any]) -> str:
    """A step's line: `mismatch` is the KL between the engine's sampled logprobs and the trainer's on the same tokens
    (train/mismatch_kl: ~1e-12 when token-exact; a KL to the reference model is train/kl_ref)."""
    fails = {
        k.split("/")[-1]: int(v) for k, v in m.items() if k.startswith("trace/failures/") and k[-4:] != "none" and v
    }
    return (
        f"step {m['step']:>3}  v{m['version']:<3} reward {_reward(m)}  traces {m.get('trace/count', 0)}"
        f"  loss {m.get('train/loss', 0):+.4f}  mismatch {m.get('train/mismatch_kl', 0):.1e}"
        f"  grad {m.get('train/grad_norm', 0):.2f}  {m.get('time/rollout_s', m.get('time/step_s', 0)):.0f}s"
        + (f"  failures {fails}" if fails else "")
        + (f"  degenerate {int(m['trace/degenerate'])}" if m.get("trace/degenerate") else "")
        + (f"  left out for dropped media {int(m['train/dropped_media'])}" if m.get("train/dropped_media") else "")
        + (f"  left out for images {int(m['train/image_traces'])}" if m.get("train/image_traces") else "")
        + ("  trained on nothing: not published" if m.get("train/empty") else "")
        + (_online(m) if "online/open" in m else "")
        + (f"  per harness {harness}" if len(harness := _per_harness(m)) > 1 else "")
    )


def _online(m: dict[str, Any]) -> str:
    """An online step's client counts: sessions open, traces waiting for a reward, and what was not trained."""
    n = {k: int(m.get(f"online/{k}", 0)) for k in ("open", "pending", "late_rewards", "expired", "reaped")}
    return "  online " + " ".join(f"{k} {v}" for k, v in n.items())


def _per_harness(m: dict[str, Any]) -> dict[str, float]:
    """{harness: mean reward, rounded} of a step (several harnesses: rollout.agents)."""
    from hrl.runners.metrics import harness_rewards

    return {name: round(v, 3) for name, v in harness_rewards(m).items()}


def step_printer() -> Any:
    """The training loop's events as lines on stderr."""

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if kind == "step":
            say(_line(data))
        elif kind == "rollout":
            say(f"iteration {data['iteration']}: {data['episodes']} episodes"
                + (f" ({data['resumed']} already done)" if data["resumed"] else "")
                + (f" ({data['rerun']} cut short by a stop run again)" if data.get("rerun") else ""))  # fmt: skip
        elif kind == "eval_start":
            say(f"held-out evaluation at step {data['step']} (policy v{data['version']}): {data['tasks']} tasks, "
                f"{data['episodes']} episodes")  # fmt: skip
        elif kind == "eval":
            say(f"held-out at step {data['step']}: success {data['eval/success']:.3f} of "
                f"{data['eval/episodes']:.0f} episodes, {data['eval/turns']:.1f} turns")  # fmt: skip
        elif kind == "resumed":
            say(f"resuming at iteration {data['iteration']}, version {data['version']}")

    return on_event


def summary(run: Any, history: list[dict[str, Any]]) -> None:
    """The run's reward curve and held-out table, on stderr."""
    curve = [None if m.get("trace/reward") is None else round(float(m["trace/reward"]), 3) for m in history]
    say(f"reward per iteration: {curve}")
    if len(curve) > 2:
        from hrl.runners.report.builder import smoothed

        say(f"smoothed:             {[None if v is None else round(v, 3) for v in smoothed(curve)]}")
    from hrl.runners.report.evaluation import before_after

    if table := before_after(run.eval_rows()):
        say(table)
