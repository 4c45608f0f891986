"""Build a tiny chat model offline and deterministically: BPE tokenizer + tool-calling template + random Qwen2.

Used by tests and the CPU demo, and by users who want to try a harness integration with no model hub. The
same seed gives byte-identical files.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from hrl.train.tiny.families import FAMILIES, Family, family_spec

__all__ = ["TinyModelConfig", "build_tiny_model", "build_tiny_tokenizer", "tiny_corpus"]

_WORDS = [
    "the",
    "a",
    "to",
    "of",
    "and",
    "in",
    "is",
    "it",
    "for",
    "on",
    "that",
    "with",
    "this",
    "file",
    "test",
    "bug",
    "fix",
    "run",
    "read",
    "write",
    "edit",
    "open",
    "close",
    "list",
    "error",
    "value",
    "return",
    "def",
    "class",
    "import",
    "from",
    "self",
    "true",
    "false",
    "none",
    "if",
    "else",
    "elif",
    "while",
    "try",
    "except",
    "raise",
    "print",
    "len",
    "range",
    "str",
    "int",
    "float",
    "dict",
    "list",
    "tuple",
    "set",
    "assert",
    "pass",
    "break",
    "continue",
    "lambda",
    "yield",
    "async",
    "await",
    "python",
    "bash",
    "git",
    "diff",
    "patch",
    "cat",
    "ls",
    "cd",
    "grep",
    "sed",
    "echo",
    "mkdir",
    "rm",
    "cp",
    "mv",
    "pytest",
    "make",
    "install",
    "tests",
    "src",
    "main",
    "function",
    "argument",
    "result",
    "output",
    "input",
    "path",
    "name",
    "type",
    "line",
    "number",
    "string",
    "index",
    "count",
    "total",
    "sum",
    "max",
    "min",
    "please",
    "done",
    "ok",
    "yes",
    "no",
    "hello",
    "world",
    "task",
    "agent",
    "model",
    "tool",
    "call",
    "answer",
    "think",
    "step",
    "next",
    "first",
    "last",
]
_TOOLS = ("bash", "read", "write", "edit", "grep", "glob", "exec_command", "run_shell_command", "str_replace")
_SNIPPETS = (
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    total += i\n",
    "if x is None:\n    raise ValueError('x')\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
    "import os\nimport sys\nfrom pathlib import Path\n",
    "assert f(2) == 4, 'wrong'\n",
    "$ pytest -q tests/\n1 failed, 3 passed in 0.12s\n",
    "diff --git a/src/m.py b/src/m.py\n--- a/src/m.py\n+++ b/src/m.py\n@@ -1,3 +1,3 @@\n-    return a - b\n+    return a + b\n",
    '{"returncode": 0, "output": ""}',
    'Traceback (most recent call last):\n  File "m.py", line 3, in <module>\nAssertionError\n',
)


_QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the tiny model. Defaults: ~0.4M parameters, a 32k-token context (rope, no extra weights)."""

    vocab_size: int = 1024
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 32768
    initializer_range: float = 0.2  # wide init: peaky distributions, so greedy decoding is stable across engines
    sliding_window: int | None = None  # positions each layer attends to (itself included); None = full attention


def tiny_corpus(seed: int, n: int = 3000) -> list[str]:
    """Procedurally generated text resembling what coding agents exchange (prose, code, shell, tool JSON)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        kind = rng.random()
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 14)))
        if kind < 0.4:
            lines.append(words.capitalize() + rng.choice([".", "?", "!", ":"]))
        elif kind < 0.7:
            lines.append(rng.choice(_SNIPPETS))
        else:
            args = {
                "command": f"{rng.choice(['ls', 'cat', 'grep -n', 'sed -n', 'python -m pytest'])} {rng.choice(_WORDS)}.py"
            }
            lines.append(json.dumps({"name": rng.choice(_TOOLS), "arguments": args}))
    return lines


def build_tiny_tokenizer(seed: int = 0, vocab_size: int = 1024, family: str = "hermes"):  # -> PreTrainedTokenizerFast
    """A byte-level BPE trained on `tiny_corpus(seed)`, with the family's special tokens and chat template (default:
    ChatML with the Hermes tool template)."""
    return train_chatml_tokenizer(tiny_corpus(seed), vocab_size, family_spec(family))


def train_chatml_tokenizer(corpus: list[str], vocab_size: int, family: Family = FAMILIES["hermes"]):
    """A byte-level BPE trained on `corpus`, with `family`'s special tokens (real special tokens: each one id, never
    split) and chat template; default ChatML's with the Hermes tool template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Qwen2's pre-tokenization (NFC, its split regex, then bytes), so the saved dir tokenizes the same whether
    # it loads as a generic fast tokenizer or as Qwen2Tokenizer (what transformers 5 picks for a qwen2 config)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(family.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=family.eos,
        pad_token=family.pad,
        bos_token=family.bos,
        unk_token=None,
    )
    fast.chat_template = family.template
    return fast


def _window(sliding_window: int | None) -> dict[str, object]:
    """Qwen2's config for a sliding window on every layer (Mistral v0.1's layout; vLLM's Qwen2 windows all layers or
    none); nothing for full attention, so that the default build's config.json stays as it always was."""
    if sliding_window is None:
        return {}
    return {"use_sliding_window": True, "sliding_window": sliding_window, "max_window_layers": 0}


def build_tiny_model(
    out_dir: str | Path, seed: int = 0, cfg: TinyModelConfig | None = None, family: str = "hermes"
) -> Path:
    """Write tokenizer, chat template, config and random weights (float32 safetensors) to `out_dir`. `family`: whose
    chat template and special tokens the tokenizer gets (`FAMILIES`); config.json records it as `hrl_family`, which
    the proxy's `tool_parser: auto` reads first. `cfg.sliding_window`: a window on every layer."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    cfg = cfg or TinyModelConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = family_spec(family)
    tokenizer = build_tiny_tokenizer(seed, cfg.vocab_size, family)
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        initializer_range=cfg.initializer_range,
        tie_word_embeddings=True,
        bos_token_id=ids(spec.bos or spec.pad),
        eos_token_id=ids(spec.eos),
        pad_token_id=ids(spec.pad),
        torch_dtype="float32",
        hrl_family=spec.name,
        **_window(cfg.sliding_window),
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.device("cpu"):
        model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() == 1:  # norms: ones, biases: small
                p.copy_(torch.ones_like(p) if "norm" in name else torch.randn(p.shape, generator=gen) * 0.02)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * cfg.initializer_range)
    stops = [ids(t) for t in spec.stops]
    model.generation_config = GenerationConfig(
        eos_token_id=stops if len(stops) > 1 else stops[0], pad_token_id=config.pad_token_id, do_sample=False
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
