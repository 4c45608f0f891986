"""`AsyncConfig`: the `async:` section of a recipe (what `-c async.KEY=VALUE` sets), and the check that its buffer can
hold a batch, apart from the asynchronous loop that reads it, so a key is checked without importing torch."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hrl.runners.errors import UsageError

__all__ = ["AsyncConfig", "check_batch_fits"]


class AsyncConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    max_in_flight: int = Field(8, ge=1, description="Episodes kept running at all times (M).")
    batch_traces: int = Field(8, ge=1, description="Finished traces per update (N), rounded up to whole groups.")
    max_staleness: int = Field(1, ge=0, description="Tokens more versions old than this are stale (see `staleness`).")
    staleness: Literal["drop", "mask"] = Field(
        "drop",
        description="drop: a trace with any stale token is left out, so its group trains short; mask: only its stale "
        "tokens leave the loss, the rest of the trace and its group train (a trace with no fresh token is dropped).",
    )
    max_buffered: int = Field(
        32,
        ge=1,
        description="Most finished-but-untrained traces before new episodes wait; must hold a batch (batch_traces "
        "rounded up to whole groups), else the trainer can wait forever (refused: check_batch_fits).",
    )
    max_failed_groups: int = Field(
        16,
        ge=0,
        description="Stop with an error once more groups than this could not complete (an episode left no trace "
        "at all); each such group is dropped and counted (`async/dropped_groups`).",
    )


def check_batch_fits(acfg: AsyncConfig, group_size: int) -> None:
    """Refuse a buffer that cannot hold a batch. The trainer waits for `batch_traces` rounded up to whole groups; no
    group starts once `max_buffered` finished traces wait. Traces finish into whole groups, so with nothing running
    and less than a batch ready, the producer starts more exactly when ready < max_buffered: always iff
    ceil(max_buffered / G) ≥ ceil(batch_traces / G). Otherwise some timing leaves the trainer waiting forever:
    from the start when ⌊max(M, G) / G⌋ + ceil(max_buffered / G) ≤ ceil(batch_traces / G) (the most ever gathered
    is less than a batch), else once a step leaves between max_buffered and a batch waiting and the episodes in
    flight end (a trainer slower than its rollouts; a group that could not complete), whatever max_in_flight is."""
    groups, buffer = -(-acfg.batch_traces // group_size), -(-acfg.max_buffered // group_size)  # ceil, in groups
    if buffer >= groups:
        return
    need, in_flight = groups * group_size, max(acfg.max_in_flight, group_size) // group_size
    lo, hi = buffer * group_size, need - group_size  # what a take can leave behind that blocks every new group
    left = f"{lo}" if lo == hi else f"{lo} to {hi}"
    takes = f"a batch takes {need} finished traces (whole groups of train.group_size={group_size})"
    if in_flight + buffer <= groups:
        raise UsageError(
            f"async.max_buffered={acfg.max_buffered} and async.max_in_flight={acfg.max_in_flight} can never fill a "
            f"batch of async.batch_traces={acfg.batch_traces}: {takes}, no new group starts once "
            f"{acfg.max_buffered} wait, and at most {(in_flight - 1 + buffer) * group_size} are ever gathered",
            hint=f"use -c async.max_buffered={need} (a whole batch) or more",
        )
    raise UsageError(
        f"async.max_buffered={acfg.max_buffered} cannot hold a batch of async.batch_traces={acfg.batch_traces}: "
        f"{takes}, and no new group starts once {acfg.max_buffered} wait, so a step that leaves {left} waiting leaves the "
        "trainer waiting forever once the episodes in flight end",
        hint=f"use -c async.max_buffered={need} (a whole batch) or more",
    )
