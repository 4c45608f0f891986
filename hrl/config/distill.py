"""The `distill:` section: on-policy distillation from a teacher (Agarwal et al. 2024, GKD; Thinking Machines'
"On-Policy Distillation", 2025). The teacher scores every token the student sampled; the per-token reverse KL
estimate, log π_student − log π_teacher on the sampled token, enters the loss as a dense advantage."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DistillConfig"]


class DistillConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    teacher: str = Field(
        "",
        description="The teacher: an HF model dir or id, a LoRA checkpoint dir, an hrl: name (loaded beside the "
        "trainer), or a running vLLM server's URL (http://host:port[/v1] or unix:/path/to/socket: it scores over "
        "HTTP, with prompt_logprobs); its tokenizer must be the student's (checked before anything starts). '' = no "
        "distillation.",
    )
    teacher_model: str = Field(
        "",
        description="With a URL teacher: the served model that scores ('' = the server's base model, refused when it "
        "serves several).",
    )
    concurrency: int = Field(8, ge=1, description="With a URL teacher: scoring requests in flight at once.")
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

    @property
    def enabled(self) -> bool:
        return bool(self.teacher)

    @property
    def remote(self) -> bool:
        """A running server scores (`teacher` is its URL), not a model loaded beside the trainer."""
        return self.teacher.startswith(("http://", "https://", "unix:"))
