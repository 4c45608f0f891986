"""Traces → token-exact training samples, one per branch of each trace's token tree. Never re-tokenizes.

A call's parent is the call whose prompt + response its prompt extends exactly (recorded by the proxy as
`parent`). Each root-to-leaf path is one sample: the leaf's prompt + response ids, with `loss_mask` = 1 on
tokens the engine sampled in this trace along that path (earlier calls' responses sit verbatim inside later
prompts, so they are still provably sampled), 0 on everything the proxy tokenized from text.

`weight` spreads each trace's unit of loss over its distinct sampled tokens: a token shared by k branches
gets 1/k of its share in each, so a trace that splits into 5 branches weighs the same as one that does not.

`mask_stale` takes tokens out of the loss by the policy version that sampled them (`async.staleness: mask`): their
`loss_mask` becomes 0, the rest of the sample and its weights stay as they were. `token_versions` lists the version of
each token that counts as sampled (one per token of the training calls: those `mask_stale` and `retained_tokens` count).

A sample whose prompt held images carries them (`media`: the leaf call's records, sha256 and placeholder range in
its ids, which hold every image of its branch, since each call's prompt extends its parent's), where their bytes are
(`media_dir`) and the image processor settings the engine used; `hrl.train.media` makes its pixel inputs.

`retained_tokens` checks the result against the trace: of the tokens the engine sampled in calls meant for training,
how many sit, id for id, at a loss-masked position of some sample (`train/retained_token_ratio`, goal 1.00).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hrl.runners.trace import all_prompt_ids, branches, expand_versions

__all__ = [
    "RETAINED_TOKEN_RATIO", "Sample", "build_samples", "mask_stale", "retained_tokens", "token_versions",
    "training_calls",
]  # fmt: skip

RETAINED_TOKEN_RATIO = "train/retained_token_ratio"  # tokens trained ÷ tokens sampled, over the step's traces

_UNUSABLE = {"error", "abort"}  # calls whose tokens never reached the agent whole


@dataclass
class Sample:
    """One branch of one trace. All lists have the same length T (the branch's token count)."""

    trace_id: str
    group_id: str
    branch: list[str]  # call ids, root to leaf
    input_ids: list[int]
    loss_mask: list[int]
    behaviour_logprobs: list[float]  # the engine's logprob where loss_mask is 1, else 0.0
    versions: list[int]  # policy version that sampled each token; -1 where loss_mask is 0
    weight: list[float] = field(default_factory=list)  # per-token share of the trace's unit weight
    reward: float = 0.0
    advantage: float = 0.0
    dense_advantage: list[float] = field(default_factory=list)  # per token, added to `advantage`; [] = none (distill)
    media: list[dict[str, Any]] = field(default_factory=list)  # the prompt's images: {sha256, placeholder, …}
    media_dir: str | None = None  # where their bytes are: media/<sha256>
    image_processor: dict[str, Any] | None = None  # the settings the engine's image processor used (None: default)

    @property
    def loss_tokens(self) -> int:
        return sum(self.loss_mask)

    def token_advantages(self) -> list[float]:
        """Each token's advantage: the trace's, plus the dense per-token term where one is set (on-policy
        distillation's, `hrl.train.distill`; turn credit's, `hrl.train.credit`; their sum where both are)."""
        if not self.dense_advantage:
            return [self.advantage] * len(self.input_ids)
        return [self.advantage + d for d in self.dense_advantage]


def _keep(include_side: bool) -> Callable[[dict[str, Any]], bool]:
    """Calls that are training nodes: whole responses the agent got, of a trainable agent (an untrained critic's
    calls are recorded only), side calls only when asked for."""
    return lambda c: (
        c["finish_reason"] not in _UNUSABLE and c.get("trainable", True) and (include_side or not c.get("side"))
    )


def training_calls(trace: dict[str, Any], include_side: bool = False) -> list[dict[str, Any]]:
    """The calls of a trace that samples train on (`_keep`), in the trace's order."""
    return [c for c in trace["calls"] if _keep(include_side)(c)]


def _branch_media(trace: dict[str, Any], path: list[int], prompts: list[list[int]]) -> list[dict[str, Any]]:
    """The images of a branch: its leaf's, each earlier call's being those of the leaf that lie in its prompt."""
    calls = trace["calls"]
    media = list(calls[path[-1]].get("media") or [])
    for i in path[:-1]:
        inside = [m for m in media if sum(m["placeholder"]) <= len(prompts[i])]
        if list(calls[i].get("media") or []) != inside:
            raise ValueError(f"trace {trace['trace_id']}: call {calls[i]['call_id']}'s images are not those its "
                             f"child's prompt holds where it extends it")  # fmt: skip
    return media


def _branch_sample(
    trace: dict[str, Any], path: list[int], prompts: list[list[int]], media_dir: str | None = None
) -> Sample:
    calls = trace["calls"]
    leaf = path[-1]
    ids = prompts[leaf] + list(calls[leaf]["response_ids"])
    mask, logps, versions = [0] * len(ids), [0.0] * len(ids), [-1] * len(ids)
    for i in path:
        start = len(prompts[i])
        resp = calls[i]["response_ids"]
        assert ids[start : start + len(resp)] == list(resp), "a parent's response is not inside its child's prompt"
        vers = expand_versions(calls[i]["versions"], len(resp))
        for j, lp in enumerate(calls[i]["response_logprobs"]):
            mask[start + j], logps[start + j], versions[start + j] = 1, float(lp), vers[j]
    return Sample(
        trace_id=trace["trace_id"],
        group_id=str(trace.get("group_id") or trace.get("task_id") or trace["trace_id"]),
        branch=[calls[i]["call_id"] for i in path],
        input_ids=ids,
        loss_mask=mask,
        behaviour_logprobs=logps,
        versions=versions,
        reward=float(trace.get("reward") or 0.0),
        media=_branch_media(trace, path, prompts),
        media_dir=media_dir,
        image_processor=calls[leaf].get("image_processor"),
    )


def build_samples(
    trace: dict[str, Any], include_side: bool = False, media_dir: str | Path | None = None
) -> list[Sample]:
    """All branch samples of one trace, with per-token weights summing to 1 over the trace. `media_dir`: where the
    bytes of the trace's images are (`media/` beside its trace file)."""
    paths = branches(trace, _keep(include_side))
    prompts = all_prompt_ids(trace)
    folder = None if media_dir is None else str(media_dir)
    samples = [_branch_sample(trace, p, prompts, folder) for p in paths]
    # how many branches hold each sampled token of each call (tokens are identified by (call, offset))
    shared: Counter[int] = Counter(i for p in paths for i in p)
    distinct = sum(len(trace["calls"][i]["response_ids"]) for i in shared)
    for s, path in zip(samples, paths, strict=True):
        s.weight = [0.0] * len(s.input_ids)
        for i in path:
            start = len(prompts[i])
            for j in range(len(trace["calls"][i]["response_ids"])):
                s.weight[start + j] = 1.0 / (shared[i] * distinct)
    return samples


def mask_stale(trace: dict[str, Any], samples: list[Sample], before: int) -> int:
    """Take every sampled token of a version older than `before` out of the loss (loss_mask 0) in the trace's
    samples; returns how many distinct tokens left the loss (a token shared by k branches counts once). Weights are
    kept: each fresh token weighs what it would have, so a trace counts for its fresh share of its unit rather than
    piling the whole unit on its few fresh tokens."""
    for s in samples:
        s.loss_mask = [0 if m and v < before else m for m, v in zip(s.loss_mask, s.versions, strict=True)]
    index = {c["call_id"]: c for c in trace["calls"]}
    calls = {call_id for s in samples for call_id in s.branch}
    return sum(
        v < before
        for call_id in calls
        for v in expand_versions(index[call_id]["versions"], len(index[call_id]["response_ids"]))
    )


def token_versions(trace: dict[str, Any], include_side: bool = False) -> list[int]:
    """The policy version of each sampled token of the trace's training calls (a whole response the agent got, of a
    trainable agent; side calls only with `include_side`), each token once: what `mask_stale` counts from."""
    calls = [c for c in trace["calls"] if _keep(include_side)(c)]
    return [v for c in calls for v in expand_versions(c["versions"], len(c["response_ids"]))]


def retained_tokens(trace: dict[str, Any], samples: list[Sample], include_side: bool = False) -> tuple[int, int]:
    """(tokens trained, tokens sampled) of one trace. Sampled: the response ids of every call meant for training (a
    whole response the agent got, of a trainable agent; side calls only with `include_side`). Trained: those found,
    each at its own offset and id for id, under loss_mask 1 in a sample whose branch holds its call; counted once
    however many branches share it."""
    calls, keep = trace["calls"], _keep(include_side)
    prompts = all_prompt_ids(trace)
    index = {c["call_id"]: i for i, c in enumerate(calls)}
    trained: set[tuple[int, int]] = set()
    for s in samples:
        for call_id in s.branch:
            i = index[call_id]
            start, resp = len(prompts[i]), calls[i]["response_ids"]
            for j, tok in enumerate(resp):
                at = start + j
                if at < len(s.input_ids) and s.input_ids[at] == tok and s.loss_mask[at] == 1:
                    trained.add((i, j))
    sampled = sum(len(c["response_ids"]) for c in calls if keep(c))
    return len(trained), sampled
