"""The `distill:` section: on-policy distillation from a teacher (Agarwal et al. 2024, GKD; Thinking Machines'
"On-Policy Distillation", 2025). The teacher scores every token the student sampled; the per-token reverse KL
estimate, log π_student − log π_teacher on the sampled token, enters the loss as a dense advantage."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hrl.errors import UsageError

__all__ = ["DistillConfig"]


class DistillConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    teacher: str = Field(
        "",
        description="The teacher: an HF model dir or id, a LoRA checkpoint dir, or an hrl: name; its tokenizer must "
        "be the student's (checked before anything starts). '' = no distillation.",
    )
    coef: float = Field(
        1.0,
        gt=0,
        description="Weight of the dense term: each sampled token's advantage gets −coef × (log π_student − "
        "log π_teacher), the student's logprob being the one the engine recorded when it sampled the token.",
    )
    batch_tokens: int = Field(
        8192,
        ge=1,
        description="Token budget of one teacher forward pass (samples sorted by length, packed while samples × "
        "longest ≤ this; a longer one goes alone).",
    )

    @field_validator("teacher")
    @classmethod
    def _no_url_yet(cls, value: str) -> str:
        """A running server as the teacher (prompt logprobs over HTTP) is not built yet: said now, not at step 0."""
        if value.startswith(("http://", "https://")):
            raise UsageError(
                f"distill.teacher={value}: a teacher behind a URL is not supported yet",
                hint="give the teacher as an HF model dir or id, or an hrl: name (it is loaded beside the trainer)",
            )
        return value

    @property
    def enabled(self) -> bool:
        return bool(self.teacher)
