"""Prefix-shared ("tree") forward passes: a batch's branches packed into one token tree, each shared prefix once.

A trace with many branches (thinking templates that drop old reasoning, compaction, sub-agents), or a GRPO group
that repeats one long prompt, holds the same prefix in many samples. Training them one per row computes that prefix
once per branch. Here the samples' token sequences become a prefix trie — across traces too, so a group's shared
prompt is one set of nodes — packed into one sequence: position id = depth, and a 4D attention mask where each node
sees its ancestors and itself only. One forward pass of the causal LM gives every node's hidden state; a token's
logprob is read off its parent's hidden state, so each branch gets exactly the logprobs (and, summed over branches,
exactly the gradients) that its own forward pass would give.

Sliding-window layers (Mistral, gpt-oss, Gemma 2/3: `config.sliding_window`, `config.layer_types`) get a windowed
mask: a node sees an ancestor fewer than `window` positions above it, as transformers' own sliding mask counts. A
model whose layers mix full and windowed attention gets one mask per layer type (the dict transformers takes in place
of one mask). A model whose attention the tree masks cannot reproduce (another attention implementation, chunked or
linear layers, mixed layers without per-layer-type masks) is declined: `on` fails naming why, `auto` logs it once
and trains one row per branch. A batch holding images is declined whatever the mode (`tree_declined_for_media`, logged
once): a packed pass has no pixel inputs, and a trie of token ids alone would merge two different images whose
placeholder runs hold the same ids (their sha256 differ, their ids do not), so such a batch trains one row per
branch, each with its own images.

Sorting the sequences lexicographically makes the trie cheap to build: a sequence's longest shared prefix with any
earlier one is its shared prefix with the one just before it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from hrl.runners.errors import HrlError
from hrl.train.logprobs import _backbone_and_head, _chunk_logp

__all__ = [
    "TREE_ATTENTION",
    "Tree",
    "attention_implementation",
    "attention_layout",
    "build_tree",
    "distinct_tokens",
    "plan",
    "token_ratio",
    "tree_declined",
    "tree_declined_for_media",
    "tree_logprobs",
    "tree_plan",
]

TREE_ATTENTION = ("eager", "sdpa")  # attention implementations that take a custom 4D mask
TREE_LAYERS = ("full_attention", "sliding_attention")  # the layer types whose attention a tree mask reproduces
_log = logging.getLogger(__name__)
_logged: set[str] = set()  # reasons `auto` has declined for, each logged once per process


@dataclass
class Tree:
    """A packed prefix trie. Nodes are numbered so that a parent precedes its children."""

    tokens: torch.Tensor  # (N,) token id of each node
    parent: torch.Tensor  # (N,) index of the parent node, -1 for a root (a sequence's first token)
    depth: torch.Tensor  # (N,) position of the node in every sequence that passes through it
    paths: list[torch.Tensor]  # per input sequence, in input order: its node at each position, (T_s,)
    shared: list[int]  # per input sequence: how many of its first nodes an earlier sequence (in sorted order) made

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def mask(self, window: int | None = None) -> torch.Tensor:
        """(N, N) boolean: True where the row node may attend to the column node (its ancestors and itself); with
        `window`, only those fewer than `window` positions above it, as transformers' sliding window counts (a query
        at position q sees keys at k > q - window: itself and the window - 1 before it)."""
        n = len(self)
        allowed = torch.zeros((n, n), dtype=torch.bool)
        for path, k in zip(self.paths, self.shared, strict=True):
            if k < len(path):  # the rows of the nodes this sequence added; earlier ones are already written
                tri = torch.ones((len(path) - k, len(path)), dtype=torch.bool).tril(k)
                allowed[path[k:].unsqueeze(1), path.unsqueeze(0)] = tri
        if window is not None:  # ancestors only are left, so depth difference = distance along the branch
            allowed &= (self.depth.unsqueeze(1) - self.depth.unsqueeze(0)) < window
        return allowed


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = torch.tensor(a[:n]) != torch.tensor(b[:n])
    return int(diff.int().argmax()) if bool(diff.any()) else n


def build_tree(seqs: list[list[int]]) -> Tree:
    """The prefix trie of `seqs` (duplicates and sequences that are prefixes of others included)."""
    order = sorted(range(len(seqs)), key=lambda i: seqs[i])
    tokens: list[int] = []
    parent: list[int] = []
    depth: list[int] = []
    paths: list[torch.Tensor | None] = [None] * len(seqs)
    shared = [0] * len(seqs)
    prev: list[int] = []
    prev_path: list[int] = []
    for i in order:
        seq = seqs[i]
        k = _lcp(prev, seq)
        path = prev_path[:k]
        for t in range(k, len(seq)):
            tokens.append(seq[t])
            parent.append(path[-1] if path else -1)
            depth.append(t)
            path.append(len(tokens) - 1)
        paths[i], shared[i] = torch.tensor(path, dtype=torch.long), k
        prev, prev_path = seq, path
    return Tree(
        tokens=torch.tensor(tokens, dtype=torch.long),
        parent=torch.tensor(parent, dtype=torch.long),
        depth=torch.tensor(depth, dtype=torch.long),
        paths=[p for p in paths if p is not None],
        shared=shared,
    )


def distinct_tokens(seqs: list[list[int]]) -> int:
    """Nodes of the prefix trie of `seqs`: the tokens a tree forward pass computes."""
    ordered = sorted(seqs)
    return sum(len(s) - _lcp(p, s) for p, s in zip([[], *ordered[:-1]], ordered, strict=True))


def plan(seqs: list[list[int]], max_tokens: int, root_cut: int = 1024) -> tuple[list[int], list[tuple[int, int]]]:
    """Order the sequences so that shared prefixes sit together, then cut that order into spans whose tries hold
    at most `max_tokens` nodes (a longer single sequence gets a span of its own). Returns (order, spans).

    A sequence that shares nothing with the one before it (a new root) also starts a new span once the current one
    holds `root_cut` nodes: packed together, trees that share nothing cost (a + b)² attention instead of a² + b²,
    while small ones are cheaper in one pass than in many."""
    order = sorted(range(len(seqs)), key=lambda i: seqs[i])
    spans: list[tuple[int, int]] = []
    start, size, prev = 0, 0, []
    for j, i in enumerate(order):
        shared = _lcp(prev, seqs[i])
        extra = len(seqs[i]) - shared
        if j > start and (size + extra > max_tokens or (shared == 0 and size >= root_cut)):
            spans.append((start, j))
            start, size, extra = j, 0, len(seqs[i])
        size += extra
        prev = seqs[i]
    if order:
        spans.append((start, len(order)))
    return order, spans


def attention_implementation(model: Any) -> str:
    backbone, _ = _backbone_and_head(model)
    return str(backbone.config._attn_implementation or "eager")


_MASK_PER_LAYER_TYPE = re.compile(r"isinstance\(\s*(?:\w+\s*:=\s*)?attention_mask\s*,\s*dict\s*\)")


@functools.cache
def _takes_mask_per_layer_type(backbone: type) -> bool:
    """Whether the backbone class's forward takes a dict of masks keyed by layer type in place of one mask
    (transformers models with mixed layers read `attention_mask` as their `causal_mask_mapping` when it is a dict)."""
    try:
        return bool(_MASK_PER_LAYER_TYPE.search(inspect.getsource(backbone.forward)))
    except (OSError, TypeError):  # no source to read: assume not
        return False


def attention_layout(model: Any) -> tuple[dict[str, int | None], str | None]:
    """Per attention layer type the model's layers use (transformers' `config.layer_types` names; a model without
    them is all "sliding_attention" when its config sets `sliding_window`, else all "full_attention"), the window its
    layers see (None = full causal attention); and why a tree pass cannot reproduce that attention (None = it can)."""
    backbone, _ = _backbone_and_head(model)
    cfg = backbone.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    # the optional fields, each where the config has it, else its default (by attribute: a field may be an alias)
    defaults = {"sliding_window": None, "use_sliding_window": True, "layer_types": None, "attention_chunk_size": None}
    fields = {name: getattr(cfg, name, default) for name, default in defaults.items()}
    window = fields["sliding_window"] if fields["use_sliding_window"] else None
    kinds = list(dict.fromkeys(fields["layer_types"] or ["sliding_attention" if window else "full_attention"]))
    layout: dict[str, int | None] = {k: window if k == "sliding_attention" else None for k in kinds}
    impl = attention_implementation(model)
    if impl not in TREE_ATTENTION:
        return layout, f"its {impl} attention takes no 4D mask (tree masks need {' or '.join(TREE_ATTENTION)})"
    if other := [k for k in kinds if k not in TREE_LAYERS]:
        return layout, f"its {', '.join(other)} layers have no tree mask (tree masks know {', '.join(TREE_LAYERS)})"
    if fields["attention_chunk_size"]:
        return layout, "its chunked attention (attention_chunk_size) has no tree mask"
    if "sliding_attention" in layout and not (isinstance(window, int) and window > 0):
        return layout, f"its sliding_attention layers have no positive sliding_window ({window!r})"
    if len(kinds) > 1 and not _takes_mask_per_layer_type(type(backbone)):
        return layout, f"{type(backbone).__name__} mixes {' and '.join(kinds)} layers but takes one mask for all"
    return layout, None


def tree_declined(model: Any) -> str | None:
    """Why a tree pass would not give this model's own attention (its logprobs and gradients); None when it would."""
    return attention_layout(model)[1]


def _require_tree(model: Any) -> dict[str, int | None]:
    layout, reason = attention_layout(model)
    if reason is not None:
        raise HrlError(
            f"tree training cannot reproduce this model's attention: {reason}",
            hint="set trainer.tree=auto (it falls back to one row per branch) or trainer.tree=off",
        )
    return layout


def _attention_mask(allowed: torch.Tensor, impl: str, dtype: torch.dtype) -> torch.Tensor:
    """(1, 1, N, N): eager adds the mask to the scores; sdpa takes a boolean one."""
    if impl == "eager":
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            ~allowed, torch.finfo(dtype).min
        )[None, None]
    return allowed[None, None]


def tree_logprobs(model: Any, seqs: list[list[int]], chunk: int = 512) -> list[torch.Tensor]:
    """Per sequence s, logp[t] = log π(s[t+1] | s[:t+1]) for t < len(s) - 1, from one forward pass over the prefix
    trie of all of them: the same values as `token_logprobs` on each sequence alone, in the model's dtype.

    Each layer type gets its own mask (full, or windowed); one type's mask goes in as the mask of every layer. The
    vocabulary projection runs over the trie's edges (one per non-root node) in chunks of `chunk` under activation
    checkpointing, as in `token_logprobs`."""
    layout = _require_tree(model)
    impl = attention_implementation(model)
    tree = build_tree(seqs)
    backbone, head = _backbone_and_head(model)
    device = next(backbone.parameters()).device
    dtype = next(backbone.parameters()).dtype
    masks = {kind: _attention_mask(tree.mask(w).to(device), impl, dtype) for kind, w in layout.items()}
    mask = next(iter(masks.values())) if len(masks) == 1 else masks
    hidden = backbone(
        input_ids=tree.tokens.to(device).unsqueeze(0),
        attention_mask=mask,
        position_ids=tree.depth.to(device).unsqueeze(0),
    ).last_hidden_state[0]  # (N, H)
    child = (tree.parent >= 0).nonzero().squeeze(1)  # every edge parent → child, named by its child
    src, targets = tree.parent[child].to(device), tree.tokens[child].to(device)
    pieces = []
    for s in range(0, len(child), chunk):
        h, t = hidden[src[s : s + chunk]].unsqueeze(0), targets[s : s + chunk].unsqueeze(0)
        if torch.is_grad_enabled():
            pieces.append(checkpoint(_chunk_logp, head, h, t, use_reentrant=False)[0])
        else:
            pieces.append(_chunk_logp(head, h, t)[0])
    edge = torch.cat(pieces) if pieces else hidden.new_zeros((0,), dtype=torch.promote_types(dtype, torch.float32))
    at = torch.full((len(tree),), -1, dtype=torch.long)  # node → its edge's row
    at[child] = torch.arange(len(child))
    return [edge[at[p[1:]].to(device)] for p in tree.paths]


def token_ratio(seqs: list[list[int]]) -> float:
    """Distinct ÷ total tokens of a batch: what a tree pass computes against one row per branch (1 = no sharing)."""
    total = sum(len(s) for s in seqs)
    return distinct_tokens(seqs) / total if total else 1.0


def tree_plan(
    model: Any, seqs: list[list[int]], mode: str, threshold: float, max_tokens: int
) -> list[list[int]] | None:
    """The micro-batches (indices into `seqs`) of tree passes, each a trie of at most `max_tokens` nodes, when `mode`
    is "on", or "auto" and the batch's distinct ÷ total tokens is below `threshold` and tree masks reproduce the
    model's attention (`tree_declined`); None for one padded row per branch."""
    if mode == "off" or not seqs:
        return None
    if mode == "on":
        _require_tree(model)
    elif token_ratio(seqs) >= threshold or _declined_once(model):
        return None
    order, spans = plan(seqs, max_tokens)
    return [order[a:b] for a, b in spans]


MEDIA_REASON = "the batch holds images (a tree pass has no pixel inputs, and its trie compares token ids, not images)"


def tree_declined_for_media(mode: str) -> None:
    """A batch with images trains one row per branch whatever `trainer.tree` says; logged once (not for `off`)."""
    if mode != "off" and MEDIA_REASON not in _logged:
        _logged.add(MEDIA_REASON)
        _log.warning("trainer.tree=%s trains one row per branch: %s", mode, MEDIA_REASON)


def _declined_once(model: Any) -> bool:
    """Whether `auto` must train this model one row per branch; the reason is logged the first time it is met."""
    reason = tree_declined(model)
    if reason is not None and reason not in _logged:
        _logged.add(reason)
        _log.warning("trainer.tree=auto trains one row per branch: %s", reason)
    return reason is not None
