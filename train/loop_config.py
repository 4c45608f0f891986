"""`LoopConfig`: the `train:` section of a recipe (what `-c train.KEY=VALUE` sets), apart from the loop that reads
it, so a key is checked without importing torch."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hrl.runners.episodes import Episode
from hrl.train.advantages import AdvantageKind
from hrl.train.sampler import SamplerKind
from hrl.train.trainer_config import TrainerConfig

__all__ = ["LoopConfig"]


class LoopConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)  # no bound holds inf or nan

    iterations: int = Field(10, ge=1, description="Training steps (one batch of rollouts each).")
    tasks_per_iteration: int = Field(4, ge=1, description="Distinct tasks per batch.")
    group_size: int = Field(4, ge=1, description="Episodes per task per batch (the GRPO group).")
    concurrency: int = Field(4, ge=1, description="Episodes running at once.")
    advantage: AdvantageKind = Field(
        "grpo",
        description="grpo: (r − mean) / std per group. mean: r − mean. dr_grpo: r − mean with the loss ÷ a constant "
        "(Dr. GRPO); sets trainer.loss_norm=constant. batch: (r − mean) / std over the whole batch (REINFORCE++): "
        "a group that all failed is pushed down when another succeeded.",
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch (PPO epochs); > 1 reuses the rollouts.")
    mini_batches: int = Field(
        1,
        ge=1,
        description="Optimizer steps per epoch, each on a share of the batch's traces. ppo_epochs × mini_batches > 1: "
        "the ratio to the update's starting policy moves, so PPO clipping acts.",
    )
    drop_zero_variance: bool = Field(False, description="Skip groups whose rewards all agree.")
    task_sampler: SamplerKind = Field(
        "uniform",
        description="Which tasks a batch takes. uniform: any task alike. signal: weighted by 1 − p^G − (1 − p)^G, "
        "the chance that a group of G carries a gradient, p = the task's success rate so far (Beta(1, 1) prior). "
        "balanced: the values of sampler_key in turn, each an equal share of the groups.",
    )
    sampler_key: str = Field(
        "",
        description="A task field (dotted path, e.g. repo, or demo.op). signal: its tasks share one success count; "
        "with many tasks each is drawn too rarely for a count of its own ('' = per task). balanced: the families "
        "taken in turn (required).",
    )
    success_reward: float = Field(
        1.0, description="A reward ≥ this is a success, for task_sampler=signal's rates and eval/success."
    )
    eval_every: int = Field(
        0,
        ge=0,
        description="With eval_tasks: also evaluate every N steps, on eval_slice of them (the whole set is "
        "evaluated at step 0 and after the last step either way; in an async run, beside the rollouts, pinned to the "
        "step's version). 0 = only then.",
    )
    eval_slice: int = Field(8, ge=1, description="Held-out tasks of an evaluation between the first and the last.")
    eval_episodes: int = Field(1, ge=1, description="Episodes per held-out task in an evaluation.")
    eval_markers: dict[str, str] = Field(
        default_factory=dict,
        description="With eval_tasks: {name: text}. Each evaluation also logs eval/has/<name>, the share of episodes "
        "whose sampled text contains the text, and eval/success_given/<name>, the success rate among those "
        "(the demo: in_place = 'sed -i', the fix written in place; success among them = the right operator).",
    )
    include_side_calls: bool = Field(False, description="Train on side calls (title generation, …) too.")
    keep_dropped_media: bool = Field(
        False,
        description="Train on traces whose requests lost media to proxy.media: drop (the model answered without "
        "seeing an image or document the agent sent). Default: left out, counted per step as train/dropped_media.",
    )
    seed: int = 0
    wandb: bool = Field(False, description="Also log metrics to Weights & Biases.")
    trainer: TrainerConfig

    def group(self, task: Any, batch: int, harness: str = "") -> list[Episode]:
        """One GRPO group: `group_size` episodes of `task` in `batch` (the sync loop's iteration, the async loop's
        group number), under `harness`. Both loops make their groups here, and only here."""
        return [Episode(task, k, batch, harness) for k in range(self.group_size)]

    @model_validator(mode="after")
    def _balanced_needs_a_key(self) -> LoopConfig:
        if self.task_sampler == "balanced" and not self.sampler_key:
            raise ValueError("train.task_sampler=balanced takes turns over a task field: set train.sampler_key")
        return self

    @model_validator(mode="after")
    def _dr_grpo_normalises_by_a_constant(self) -> LoopConfig:
        """Dr. GRPO is both halves: no std scaling (the advantage) and the constant normaliser (the trainer's)."""
        if self.advantage != "dr_grpo" or self.trainer.loss_norm == "constant":
            return self
        if "loss_norm" in self.trainer.model_fields_set:
            raise ValueError(
                "train.advantage=dr_grpo normalises the loss by a constant, but trainer.loss_norm=trace was set: "
                "drop trainer.loss_norm, or use train.advantage=mean for r − mean with the per-trace token mean"
            )
        self.trainer = self.trainer.model_copy(update={"loss_norm": "constant"})
        return self
