"""Test helpers around the tiny model: build once per session, make LoRA adapters and perturbed checkpoints,
and recompute logprobs / greedy continuations with plain transformers (the reference every engine must match)."""

from __future__ import annotations

from pathlib import Path

import torch


def chat_prompt(model_dir: str, text: str = "fix the failing test in m.py") -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tok.encode(rendered, add_special_tokens=False)


def load_hf(model_dir: str, adapter: str | None = None, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).eval()
    return model


@torch.no_grad()
def recompute_logprobs(model, prompt: list[int], response: list[int]) -> list[float]:
    """Teacher-forced logprobs of `response` after `prompt` in one full forward pass (no KV cache)."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (R, V)
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0].tolist()


@torch.no_grad()
def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


def make_lora(model_dir: str, out: Path, seed: int = 1, scale: float = 0.1) -> Path:
    """A random r=8 LoRA on all projections with non-zero B, so it really changes the model's outputs."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = load_hf(model_dir)
    cfg = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, scale)
    model.save_pretrained(out)
    return out


def make_full(model_dir: str, out: Path, seed: int = 2, scale: float = 0.1) -> Path:
    """A perturbed copy of the model saved as a full checkpoint (tokenizer files included)."""
    import shutil

    torch.manual_seed(seed)
    model = load_hf(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    model.save_pretrained(out)
    for f in Path(model_dir).iterdir():
        if f.name.startswith(("tokenizer", "chat_template")):
            shutil.copy(f, out / f.name)
    return out
