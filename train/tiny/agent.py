"""`hrl models tiny-agent`: a few-million-parameter agent model, warm-started on synthetic mini-swe-agent episodes.

Offline and reproducible: the same seed and config give the same files wherever torch's CPU kernels compute the same
floats (same torch build and instruction set, recorded as the build's `machine`; the thread count is part of the
config). No input depends on the machine: the uname line of most prompts is the harness profile's capture machine, so
the demo recipe ships one build (`recipes/demo/model/`, `shipped_model`) that `hrl models tiny-agent DIR --verify`
rebuilds and compares: byte for byte on a machine like the builder's, as the same model elsewhere (`verify`).

1. Generate SFT tasks (demo bugs disjoint from the recipe's training and held-out tasks) and, for each, one
   transcript in mini-swe-agent's own format (`tasks`, `transcripts`): `cat *.py`, `sed` a fix, submit.
   `Noise` makes the fix often wrong, so the model succeeds sometimes and RL has something to improve.
2. Train a byte-level BPE on those transcripts (so the harness's long instance prompt costs few tokens).
3. Render every transcript to token ids exactly as the proxy would at rollout time and train a random Qwen2 on
   the assistant tokens only (AdamW, warmup + cosine), emitting progress events. A curriculum over the prompt:
   first the task alone ("bare", ~200 tokens: reading the operator out of the `cat` output is learned here, in
   a few hundred cheap steps), then with the system prompt and tools ("brief"), then the harness's full prompt
   (~1050 tokens). The prompt part of each sequence runs without gradient (most of the cost, same text each time).
4. Save an HF model dir (float32 safetensors, tokenizer with the ChatML + Hermes tool template) and
   `tiny_agent.json` (the config, seed, final loss, build time). Building into a dir that already holds the same
   build is a no-op.

`profile.capture_profile` (re)captures the harness profile the transcripts are made from, by running the real CLI.
"""

from __future__ import annotations

import hashlib
import json
import platform
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from hrl.runners.engines.decode import kv_cache_of, with_kv_cache
from hrl.train.tiny.model import train_chatml_tokenizer
from hrl.train.tiny.profile import HarnessProfile, load_profile
from hrl.train.tiny.tasks import demo_tasks, signature, split_tasks, task_bug
from hrl.train.tiny.transcripts import Context, Noise, episode_messages, render_ids, render_ids_fast, transcript

__all__ = [
    "BUILD_INFO",
    "FLOAT_FLAGS",
    "TinyAgentConfig",
    "build_info",
    "build_tiny_agent",
    "machine",
    "random_qwen2",
    "sft",
    "shipped_model",
]

BUILD_INFO = "tiny_agent.json"
SHIPPED_DIR = "model"  # beside the demo recipe: the default build, as `hrl models tiny-agent` writes it
DATA_VERSION = 1  # bump when the generated tasks or transcripts change
Event = Callable[[str, dict[str, Any]], None]
# The x86 features that choose which float kernels MKL and oneDNN run (AMX tiles and bf16 dot products change the
# order, hence the rounding, of float32 sums too). The shipped build was made on a CPU with all six.
FLOAT_FLAGS = ("fma", "avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


class TinyAgentConfig(BaseModel):
    seed: int = Field(0, description="Seed for SFT tasks, noise, tokenizer corpus, weights and batch order.")
    vocab_size: int = Field(2048, description="BPE vocabulary size (special tokens included).")
    hidden_size: int = 192
    num_layers: int = 4
    num_heads: int = 6
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = Field(4096, description="Context window in tokens.")
    examples: int = Field(1280, description="SFT transcripts (one per generated task).")
    bare_steps: int = Field(300, description="Steps on transcripts with only the task as prompt (learn to read).")
    bare_batch_size: int = 16
    brief_steps: int = Field(100, description="Then steps with the system prompt, tools and task (no instructions).")
    brief_batch_size: int = 16
    steps: int = Field(60, description="Then steps on the harness's full prompt (~1050 tokens per episode).")
    batch_size: int = 8
    lr: float = Field(3e-3, description="Peak AdamW learning rate (linear warmup, cosine decay to 10%).")
    warmup_steps: int = 10
    right_op: float = Field(Noise.right_op, description="Share of transcripts whose fix uses the right operator.")
    in_place: float = Field(Noise.in_place, description="Share of transcripts whose sed edits in place (-i).")
    foreign_uname: float = Field(0.3, description="Share of prompts with another machine's uname line.")
    uname: str = Field("", description="The uname line of the other prompts; '' = the harness profile's capture "
                       "machine's (not this machine's: a kernel update would change the build).")  # fmt: skip
    threads: int = Field(2, description="torch threads while training; the float sums, so the bytes, depend on it.")

    def key(self) -> str:
        """Identifies a build: the config, the data format version and the harness profile."""
        raw = {"config": self.model_dump(), "profile": load_profile().__dict__}
        return hashlib.sha256(json.dumps({**raw, "v": DATA_VERSION}, sort_keys=True).encode()).hexdigest()[:16]


def build_info(out_dir: str | Path) -> dict[str, Any] | None:
    """The build record of a tiny-agent model dir, or None when the dir holds none."""
    path = Path(out_dir) / BUILD_INFO
    return json.loads(path.read_text()) if path.is_file() else None


def file_digests(model_dir: str | Path) -> dict[str, str]:
    """sha256 of every file of a build but its record (which holds the build's wall time)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(model_dir).iterdir()) if p.is_file() and p.name != BUILD_INFO}  # fmt: skip


def machine() -> dict[str, Any]:
    """What decides the float kernels torch runs here: its build, the CPU vendor, its CPU capability, the flags."""
    import torch

    vendor, flags = platform.machine(), set[str]()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "vendor_id" and vendor == platform.machine():
                vendor = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    return {"torch": torch.__version__, "vendor": vendor, "capability": torch.backends.cpu.get_cpu_capability(),
            "flags": [f for f in FLOAT_FLAGS if f in flags]}  # fmt: skip


def shipped_model() -> Path | None:
    """The default build shipped with the demo recipe (a directory), or None where the package has none."""
    from importlib.resources import files

    path = Path(str(files("hrl.recipes") / "demo" / SHIPPED_DIR))
    return path if (path / BUILD_INFO).is_file() else None


def _install_shipped(cfg: TinyAgentConfig, out: Path, key: str, on_event: Event) -> bool:
    """Copy the shipped build into `out` when it is this config's build; refuse one whose files do not match its
    record (a damaged checkout) rather than serve it."""
    import shutil

    src = shipped_model()
    info = build_info(src) if src else None
    if src is None or info is None or info.get("key") != key:
        return False
    if file_digests(src) != info.get("sha256"):
        raise RuntimeError(f"the shipped tiny agent model in {src} does not match its sha256 record; "
                           "restore it from git, or build one with `hrl models tiny-agent DIR --force`")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)  # a folder of the user's: files of other names stay
    (out / BUILD_INFO).unlink(missing_ok=True)
    for name in info["sha256"]:
        shutil.copyfile(src / name, out / name)
    shutil.copyfile(src / BUILD_INFO, out / BUILD_INFO)  # last: a copy cut short is not a build
    on_event("shipped", {**info, "from": str(src)})
    return True


def _foreign_uname(rng: random.Random) -> str:
    kernel = f"{rng.choice([5, 6])}.{rng.randint(1, 19)}.{rng.randint(0, 120)}"
    flavour = rng.choice(["-generic #{n}-Ubuntu SMP", "-cloud-amd64 #1 SMP Debian", "-{n}.fc39.x86_64 #1 SMP"])
    return f"Linux {kernel}{flavour.format(n=rng.randint(1, 200))} PREEMPT_DYNAMIC x86_64"


def sft_episodes(cfg: TinyAgentConfig, profile: HarnessProfile) -> list[tuple[str, list[Any], str]]:
    """(task text, turns, uname line) per SFT transcript; tasks disjoint from the recipe's task files."""
    used = {signature(task_bug(t)) for tasks in split_tasks().values() for t in tasks}
    rng = random.Random(cfg.seed * 7919 + 17)
    noise, here = Noise(cfg.right_op, cfg.in_place), cfg.uname or profile.uname
    out = []
    for task in demo_tasks(1_000_003 + cfg.seed, cfg.examples, "sft", used):
        uname = _foreign_uname(rng) if rng.random() < cfg.foreign_uname else here
        out.append((task.problem_statement, transcript(task_bug(task), rng, noise), uname))
    return out


def random_qwen2(cfg: TinyAgentConfig, tokenizer: Any) -> Any:
    """A randomly initialised Qwen2 of `cfg`'s shape over `tokenizer` (seeded by `cfg.seed`), greedy by default."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"), torch_dtype="float32",
    )  # fmt: skip
    torch.manual_seed(cfg.seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=False
    )
    return model


def _lr(cfg: TinyAgentConfig, step: int) -> float:
    import math

    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.bare_steps + cfg.brief_steps + cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def _batch(batch: list[tuple[list[int], list[int]]]) -> dict[str, Any]:
    """Split each sample before its first loss token: the prompt (left-padded, run without gradient: it is most of
    every sequence and the same harness text each time) and the rest (right-padded, trained)."""
    import torch

    cuts = [mask.index(1) - 1 for _, mask in batch]  # keep the token before the first target in the trained part
    p_len = max(cuts)
    r_len = max(len(ids) - c for (ids, _), c in zip(batch, cuts, strict=True))
    b = len(batch)
    prompt = torch.zeros((b, p_len), dtype=torch.long)  # (B, P) left-padded
    p_mask = torch.zeros((b, p_len), dtype=torch.long)
    rest = torch.zeros((b, r_len), dtype=torch.long)  # (B, R) right-padded
    r_mask = torch.zeros((b, r_len), dtype=torch.long)
    labels = torch.full((b, r_len), -100, dtype=torch.long)  # (B, R): the next token where it is a loss token
    for i, ((ids, mask), c) in enumerate(zip(batch, cuts, strict=True)):
        prompt[i, p_len - c :] = torch.tensor(ids[:c])
        p_mask[i, p_len - c :] = 1
        rest[i, : len(ids) - c] = torch.tensor(ids[c:])
        r_mask[i, : len(ids) - c] = 1
        targets = [t if m else -100 for t, m in zip(ids[c + 1 :], mask[c + 1 :], strict=True)]
        labels[i, : len(ids) - c - 1] = torch.tensor(targets, dtype=torch.long)
    return {"prompt": prompt, "p_mask": p_mask, "rest": rest, "r_mask": r_mask, "labels": labels}


def sft_loss(model: Any, batch: dict[str, Any], prompt_grad: bool = False) -> Any:
    """Mean cross-entropy over the loss tokens of a `_batch`."""
    import contextlib

    import torch

    p_mask, r_mask = batch["p_mask"], batch["r_mask"]
    with contextlib.nullcontext() if prompt_grad else torch.no_grad():
        pos = (p_mask.cumsum(-1) - 1).clamp(min=0)
        cache = model(input_ids=batch["prompt"], attention_mask=p_mask, position_ids=pos, use_cache=True)
    mask = torch.cat([p_mask, r_mask], dim=1)
    pos = p_mask.sum(-1, keepdim=True) + torch.arange(r_mask.shape[1])[None, :]  # (B, R)
    logits = model(
        input_ids=batch["rest"], attention_mask=mask, position_ids=pos, **with_kv_cache(model, kv_cache_of(cache))
    ).logits  # (B, R, V)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100)


Data = list[tuple[list[int], list[int]]]


def sft(model: Any, phases: list[tuple[Callable[[], Data], int, int]], cfg: TinyAgentConfig, on_event: Event) -> float:
    """Train on the masked (assistant) tokens, phase by phase ((its data as the phase starts, steps, batch size)
    each); returns the mean loss of the last 10% of steps."""
    import torch

    rng = random.Random(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    losses: list[float] = []
    total = sum(steps for _, steps, _ in phases)
    for make_data, steps, size in phases:
        data = make_data()
        order: list[int] = []
        for _ in range(steps):
            if len(order) < size:
                order += rng.sample(range(len(data)), len(data))
            batch, order = [data[i] for i in order[:size]], order[size:]
            for group in opt.param_groups:
                group["lr"] = _lr(cfg, len(losses))
            loss = sft_loss(model, _batch(batch))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(float(loss.detach()))
            on_event("step", {"step": len(losses), "steps": total, "loss": losses[-1]})
    tail = losses[-max(1, len(losses) // 10) :]
    return sum(tail) / len(tail)


def build_tiny_agent(
    out_dir: str | Path,
    cfg: TinyAgentConfig | None = None,
    on_event: Event = lambda kind, data: None,
    use_shipped: bool = True,
) -> Path:
    """Build (or find already built) the tiny agent model in `out_dir`; see the module docstring. With `use_shipped`,
    the recipe's shipped build of this exact config is copied instead of trained (seconds, not minutes)."""
    import torch

    cfg, out, t0 = cfg or TinyAgentConfig(), Path(out_dir), time.monotonic()
    key = cfg.key()
    if (info := build_info(out)) is not None and info.get("key") == key:
        on_event("cached", info)
        return out
    if use_shipped and _install_shipped(cfg, out, key, on_event):
        return out
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        info = _build(cfg, out, key, t0, on_event)
    finally:
        torch.set_num_threads(threads)  # the caller's (hrl train builds in-process, then trains)
    on_event("done", info)
    return out


def _build(cfg: TinyAgentConfig, out: Path, key: str, t0: float, on_event: Event) -> dict[str, Any]:
    import torch

    from hrl.runners.proxy.template import ChatTemplate

    profile = load_profile()
    episodes = sft_episodes(cfg, profile)
    on_event("data", {"examples": len(episodes)})
    corpus = [text for task, turns, _ in episodes for text in episode_messages(profile, task, turns)]
    tokenizer = train_chatml_tokenizer(corpus, cfg.vocab_size)
    out.mkdir(parents=True, exist_ok=True)
    model = random_qwen2(cfg, tokenizer)
    model.save_pretrained(out, safe_serialization=True)  # config first: the proxy's ChatTemplate loads the dir
    tokenizer.save_pretrained(out)
    template = ChatTemplate(str(out))

    def tokenized(context: Context) -> Callable[[], Data]:
        def render() -> Data:
            data = [render_ids_fast(template, profile, t, turns, u, context) for t, turns, u in episodes]  # type: ignore[arg-type]
            mean = sum(len(d[0]) for d in data) / len(data)
            on_event("tokenized", {"context": context, "examples": len(data), "mean_tokens": mean})
            return data

        return render

    # each phase's transcripts are rendered as it starts: a build stopped early (`verify.rebuild_start`) renders
    # only what it trains on; the ids, and so the build, are the same
    phases = [(tokenized(context), steps, size) for context, steps, size in [
        ("bare", cfg.bare_steps, cfg.bare_batch_size),
        ("brief", cfg.brief_steps, cfg.brief_batch_size),
        ("full", cfg.steps, cfg.batch_size),
    ] if steps > 0]  # fmt: skip
    for task, turns, uname in episodes[-4:]:  # the one-shot rendering is the proxy's call-by-call one
        if render_ids(template, profile, task, turns, uname) != render_ids_fast(template, profile, task, turns, uname):
            raise RuntimeError("SFT rendering differs from the proxy's prompt building")
    loss = sft(model, phases, cfg, on_event)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    n_params = sum(p.numel() for p in model.parameters())
    info = {"key": key, "config": cfg.model_dump(), "params": n_params, "final_loss": round(loss, 4),
            "seconds": round(time.monotonic() - t0, 1), "agent": f"{profile.agent} {profile.version}",
            "torch": torch.__version__, "machine": machine(), "sha256": file_digests(out)}  # fmt: skip
    (out / BUILD_INFO).write_text(json.dumps(info, indent=1) + "\n")
    return info
