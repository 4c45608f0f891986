"""Where step metrics go: always `<run>/metrics.jsonl`; TensorBoard (`<run>/tensorboard/`) by default; W&B
when asked. A backend that cannot be imported is skipped with one `warning` event, never an exception: losing
a dashboard must not stop a run.

    with MetricsSink(run.path, wandb=cfg.wandb, on_event=on_event) as sink:
        sink.log(metrics)            # a flat dict of numbers; `step` in it (or step=) is the x axis
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from hrl.runners.durable import append_durably
from hrl.runners.telemetry.otlp import export_step

__all__ = ["MetricsSink"]

Event = Callable[[str, dict[str, Any]], None]


def _scalar(value: Any) -> float | None:
    """A finite float for a number (bools and non-finite values excluded), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _json_safe(value: Any) -> Any:
    """NaN and ±inf become null so every line is strict JSON."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


class MetricsSink:
    """One step's dict → one metrics.jsonl line (append + fsync) + TensorBoard scalars + W&B (when enabled).

    `backends` lists what is live; `warnings` what was skipped and why (also sent once as a `warning` event).
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str = "hrl",
        config: dict[str, Any] | None = None,
        on_event: Event | None = None,
    ) -> None:
        self.path = Path(run_dir)
        self.path.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.path / "metrics.jsonl"
        self.backends: list[str] = ["jsonl"]
        self.warnings: list[str] = []
        self._on_event = on_event or (lambda kind, data: None)
        self._tb: Any = self._open_tensorboard() if tensorboard else None
        self._wandb: Any = self._open_wandb(wandb_project, config) if wandb else None

    # ---- backends ------------------------------------------------------------------------------------------
    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        self._on_event("warning", {"source": "metrics", "message": message})

    def _open_tensorboard(self) -> Any:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            self._warn(f"TensorBoard logging is off ({e}); metrics go to {self.jsonl} only. `pip install tensorboard`")
            return None
        self.backends.append("tensorboard")
        return SummaryWriter(log_dir=str(self.path / "tensorboard"))

    def _open_wandb(self, project: str, config: dict[str, Any] | None) -> Any:
        try:
            import wandb
        except ImportError:
            self._warn("W&B logging was asked for but `wandb` is not installed; `pip install wandb`")
            return None
        self.backends.append("wandb")
        return wandb.init(project=project, name=self.path.name, dir=str(self.path), config=config, resume="allow")

    # ---- logging -------------------------------------------------------------------------------------------
    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Write one step. `step` defaults to `metrics["step"]`; it is stored in the JSON line too."""
        if step is None:
            step = int(metrics.get("step", 0))
        row = {"step": step, **{k: _json_safe(v) for k, v in metrics.items() if k != "step"}}
        data = (json.dumps(row, default=float) + "\n").encode()
        append_durably(self.jsonl, data)
        scalars = {k: v for k, v in ((k, _scalar(v)) for k, v in metrics.items() if k != "step") if v is not None}
        if self._tb is not None:
            for name, value in scalars.items():
                self._tb.add_scalar(name, value, global_step=step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        export_step(metrics, step)  # a `rl.step` span when the run exports OTLP (runners/telemetry/otlp.py)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsSink:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
