"""Prefix-shared ("tree") training: one packed forward pass over a batch's token trie gives every branch exactly the
logprobs and parameter gradients of its own forward pass (float64), full or sliding-window attention alike, and the
trainer takes the same step with it; a model whose attention tree masks cannot reproduce is declined."""

from __future__ import annotations

import itertools
import logging
import random
import types
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hrl.runners.errors import HrlError
from hrl.train import tree as tree_module
from hrl.train.logprobs import token_logprobs
from hrl.train.samples import Sample
from hrl.train.trainer import Trainer, TrainerConfig
from hrl.train.tree import attention_layout, build_tree, distinct_tokens, plan, token_ratio, tree_logprobs, tree_plan

VOCAB = 13
WINDOW = 4  # shorter than most branches `forests` draws (up to 14 tokens each, longer where they extend others)
LAYERS = {  # layer types of the 2-layer test models; None = full attention throughout, no window in the config
    "full": None,
    "sliding": ["sliding_attention", "sliding_attention"],  # Mistral v0.1: every layer windowed, one mask
    "alternating": ["sliding_attention", "full_attention"],  # gpt-oss / Gemma: one mask per layer type
}


def _qwen2(attn: str = "sdpa", dtype: torch.dtype = torch.float64, seed: int = 0, layers: str = "full"):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    window = {} if LAYERS[layers] is None else {"use_sliding_window": True, "sliding_window": WINDOW}
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation=attn,
        layer_types=LAYERS[layers],
        **window,
    )
    return Qwen2ForCausalLM(cfg).to(dtype).eval()


def _rms_norm_in_own_dtype(self, hidden: torch.Tensor) -> torch.Tensor:
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden * torch.rsqrt(variance + self.variance_epsilon))


@pytest.fixture(scope="module", params=list(LAYERS))
def model64(request):
    """A float64 Qwen2 computed in float64 throughout, with full, sliding-window or alternating layers. HF's
    Qwen2RMSNorm rounds through float32 (it is written for bf16 weights), which would cap every gradient comparison
    at float32 precision (~1e-7 apart even between one backward of w1 + w2 and two backwards of w1, w2); its norms
    here use the same formula in their own dtype."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    model = _qwen2(layers=request.param)
    for module in model.modules():
        if isinstance(module, Qwen2RMSNorm):
            module.forward = types.MethodType(_rms_norm_in_own_dtype, module)
    return model


@st.composite
def forests(draw: st.DrawFn) -> list[list[int]]:
    """Branches that share prefixes of any length: 0 (a new root, so branching at position 0), part of an earlier
    branch, all of it (a duplicate, or a prefix of a longer branch when nothing follows)."""
    tokens = st.integers(0, VOCAB - 1)
    seqs = [draw(st.lists(tokens, min_size=1, max_size=14))]
    for _ in range(draw(st.integers(0, 7))):
        base = draw(st.sampled_from(seqs))
        cut = draw(st.integers(0, len(base)))
        seqs.append(base[:cut] + draw(st.lists(tokens, min_size=0 if cut else 1, max_size=14)))
    return seqs


def _alone(model, seq: list[int]) -> torch.Tensor:
    if len(seq) < 2:
        return torch.zeros(0, dtype=torch.float64)
    return token_logprobs(model, torch.tensor([seq]), torch.ones((1, len(seq)), dtype=torch.long), chunk=4)[0]


def _grads(model) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=False)
    return grads


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seqs=forests(), seed=st.integers(0, 2**16))
@example(seqs=[[3, 1, 4], [3, 1, 4], [5, 9], [3], [3, 1, 4, 1, 5], [9, 2, 6]], seed=0)  # duplicates, roots, a prefix
@example(seqs=[[7]], seed=1)  # nothing to predict
@example(seqs=[[*range(12)], [*range(9), 5, 5, 5], [*range(2), 1, 1, 1, 1, 1, 1]], seed=2)  # branching past the window
def test_tree_logprobs_and_gradients_equal_independent_branches(model64, seqs, seed):
    model = model64
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(max(len(s) - 1, 0), generator=gen, dtype=torch.float64) for s in seqs]
    model.zero_grad(set_to_none=False)
    alone = []
    for s, w in zip(seqs, weights, strict=True):  # independent per-branch training: one forward/backward each
        lp = _alone(model, s)
        if lp.requires_grad:
            (lp * w).sum().backward()
        alone.append(lp.detach())
    want = _grads(model)
    tree = tree_logprobs(model, seqs, chunk=5)
    loss = sum((lp * w).sum() for lp, w in zip(tree, weights, strict=True))
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        loss.backward()
    got = _grads(model)
    assert [len(t) for t in tree] == [max(len(s) - 1, 0) for s in seqs]
    assert all(t.dtype == torch.float64 for t in tree)
    assert (
        max((float((t.detach() - a).abs().max()) for t, a in zip(tree, alone, strict=True) if len(a)), default=0) < 1e-9
    )
    assert max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True)) < 1e-9
    assert any(float(w.abs().max()) > 0 for w in want) or all(
        len(s) < 2 for s in seqs
    )  # the check had something to see


@given(seqs=forests(), window=st.one_of(st.none(), st.integers(1, 6)))
@settings(max_examples=60, deadline=None)
def test_trie_holds_each_distinct_prefix_once_and_sees_only_ancestors(seqs, window):
    tree = build_tree(seqs)
    prefixes = {tuple(s[: t + 1]) for s in seqs for t in range(len(s))}
    assert len(tree) == len(prefixes) == distinct_tokens(seqs)
    node_prefix = {}
    for s, path in zip(seqs, tree.paths, strict=True):
        assert tree.tokens[path].tolist() == s and tree.depth[path].tolist() == list(range(len(s)))
        for t, n in enumerate(path.tolist()):
            assert node_prefix.setdefault(n, tuple(s[: t + 1])) == tuple(s[: t + 1])
            assert int(tree.parent[n]) == (int(path[t - 1]) if t else -1)
    mask = tree.mask(window)
    for n, pre in node_prefix.items():  # row n: the nodes whose prefix is a prefix of n's, fewer than `window` back
        seen = {m for m in range(len(tree)) if bool(mask[n, m])}
        near = {m for m, q in node_prefix.items() if window is None or len(pre) - len(q) < window}
        assert seen == {m for m, q in node_prefix.items() if pre[: len(q)] == q} & near


@given(seqs=forests(), max_tokens=st.integers(1, 40), root_cut=st.integers(1, 30))
@settings(max_examples=60, deadline=None)
def test_plan_cuts_sorted_batches_into_tries_of_bounded_size(seqs, max_tokens, root_cut):
    order, spans = plan(seqs, max_tokens, root_cut)
    assert sorted(order) == list(range(len(seqs)))
    assert [seqs[i] for i in order] == sorted(seqs)
    assert spans[0][0] == 0 and spans[-1][1] == len(seqs)
    assert all(a < b for a, b in spans) and all(b == c for (_, b), (c, _) in itertools.pairwise(spans))
    for a, b in spans:
        part = [seqs[i] for i in order[a:b]]
        assert b - a == 1 or distinct_tokens(part) <= max_tokens
        for k in range(1, len(part)):  # a new root joins a span only while the span is under root_cut
            if part[k][0] != part[k - 1][0]:
                assert distinct_tokens(part[:k]) < root_cut


@pytest.mark.parametrize("layers", list(LAYERS))
def test_eager_attention_tree_matches_within_its_float32_softmax(layers):
    """Eager attention runs its softmax in float32 whatever the weights' dtype, so float32-level agreement is what
    it can give; sdpa gives the float64 exactness above. Eager takes additive float masks, one per layer type."""
    model = _qwen2("eager", torch.float32, layers=layers)
    seqs = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 9], [1, 2, 3, 4, 5, 6], [8, 7, 6], [1]]
    with torch.no_grad():
        tree = tree_logprobs(model, seqs)
        for t, s in zip(tree, seqs, strict=True):
            if len(s) > 1:
                assert float((t - _alone(model, s)).abs().max()) < 1e-5


@pytest.mark.parametrize("layers", ["sliding", "alternating"])
def test_the_window_is_in_effect_in_the_windowed_models(layers):
    """What the windowed cases above check is real: per branch, transformers applies the window, so a branch's
    logprobs equal the same weights' without a window up to position WINDOW - 1 and differ from WINDOW on (the first
    query with a key out of reach). float64 rounding is ~1e-16 per operation, so 1e-12 is equal and 1e-6 is not."""
    windowed, full = _qwen2(layers=layers), _qwen2(layers="full")
    assert all(torch.equal(a, b) for a, b in zip(windowed.parameters(), full.parameters(), strict=True))
    assert attention_layout(windowed) == (
        {k: WINDOW if k == "sliding_attention" else None for k in LAYERS[layers]},
        None,
    )
    seq = [(5 * t + 1) % VOCAB for t in range(3 * WINDOW)]
    with torch.no_grad():
        delta = (_alone(windowed, seq) - _alone(full, seq)).abs()  # (3W - 1,)
    assert float(delta[:WINDOW].max()) < 1e-12 and float(delta[WINDOW:].min()) > 1e-6


def _windowed(arch: str):
    """A 2-layer gpt-oss (eager, attention sinks, MoE) or Gemma 3 (sdpa) text model: sliding then full layers."""
    import transformers

    torch.manual_seed(0)
    shape = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "head_dim": 8,
             "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": WINDOW}  # fmt: skip
    if arch == "gpt-oss":
        cfg = transformers.GptOssConfig(
            **shape, num_local_experts=2, num_experts_per_tok=1, attn_implementation="eager"
        )
        return transformers.GptOssForCausalLM(cfg).eval()
    cfg = transformers.Gemma3TextConfig(**shape, layer_types=LAYERS["alternating"], attn_implementation="sdpa")
    return transformers.Gemma3ForCausalLM(cfg).eval()


@pytest.mark.parametrize("arch", ["gpt-oss", "Gemma 3"])
def test_alternating_windows_of_real_architectures_match_per_branch_in_float32(arch):
    """gpt-oss's grouped-matmul experts take no float64, so float32: logprobs of magnitude ~ln(13) a few dozen
    roundings deep (eps 1.2e-7) agree to < 1e-5. The window matters here: a window wider than the branches moves
    per-branch logprobs by far more than that."""
    model = _windowed(arch)
    assert attention_layout(model) == ({"sliding_attention": WINDOW, "full_attention": None}, None)
    seqs = [[*range(12)], [*range(9), 5, 5, 5], [*range(2), 1, 1, 1, 1, 1, 1], [3, 3]]
    with torch.no_grad():
        tree, alone = tree_logprobs(model, seqs), [_alone(model, s) for s in seqs]
        model.config.sliding_window = 64
        wide = [_alone(model, s) for s in seqs]
    assert max(float((t - a).abs().max()) for t, a in zip(tree, alone, strict=True)) < 1e-5
    assert max(float((w - a).abs().max()) for w, a in zip(wide, alone, strict=True)) > 1e-3


def _mistral_with_layer_types():
    """A config that names alternating layer types for a model class that applies one (sliding) mask to every layer
    (transformers warns: a Ministral checkpoint loaded as Mistral)."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, sliding_window=WINDOW, layer_types=LAYERS["alternating"])  # fmt: skip
    return MistralForCausalLM(cfg).eval()


def test_a_model_whose_attention_tree_masks_cannot_reproduce_is_declined(monkeypatch, caplog):
    """on: an error naming why; auto: one row per branch, the reason logged once however often it is met."""
    model = _mistral_with_layer_types()
    seqs = [[1, 2, 3, 4, 5, 6, 7]] * 4  # one branch four times: auto would pack it (1/4 distinct)
    reason = "MistralModel mixes sliding_attention and full_attention layers but takes one mask for all"
    with pytest.raises(HrlError, match=reason) as e:
        tree_plan(model, seqs, "on", 0.75, 100)
    assert "trainer.tree=auto" in e.value.hint
    with pytest.raises(HrlError, match="cannot reproduce"):
        tree_logprobs(model, seqs)
    monkeypatch.setattr(tree_module, "_logged", set())  # other tests in this process may have met the reason
    with caplog.at_level(logging.WARNING, logger="hrl.train.tree"):
        assert tree_plan(model, seqs, "auto", 0.75, 100) is None
        assert tree_plan(model, seqs, "auto", 0.75, 100) is None
    logged = [r.getMessage() for r in caplog.records if r.name == "hrl.train.tree"]
    assert logged == [f"trainer.tree=auto trains one row per branch: {reason}"]
    assert tree_plan(_qwen2(layers="alternating"), seqs, "auto", 0.75, 100) == [[0, 1, 2, 3]]


def test_layers_without_a_tree_mask_are_declined():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, layer_types=["full_attention", "chunked_attention"])  # fmt: skip
    reason = attention_layout(Qwen2ForCausalLM(cfg))[1]
    assert reason is not None and "chunked_attention layers have no tree mask" in reason


# ---- the trainer --------------------------------------------------------------------------------------------------
def _group(n: int, prompt: int, response: int, seed: int = 0) -> list[Sample]:
    """A GRPO group: n traces with one shared prompt, distinct sampled responses (two of them identical)."""
    rng = random.Random(seed)
    shared = [rng.randrange(VOCAB) for _ in range(prompt)]
    out = []
    for i in range(n):
        resp = [rng.randrange(VOCAB) for _ in range(response)] if i != 1 else list(out[0].input_ids[prompt:])
        ids = shared + resp
        mask = [0] * prompt + [1] * response
        out.append(
            Sample(
                trace_id=f"t{i}",
                group_id="g",
                branch=["c"],
                input_ids=ids,
                loss_mask=mask,
                behaviour_logprobs=[-rng.uniform(1, 4) * m for m in mask],
                versions=[m - 1 for m in mask],
                weight=[m / response for m in mask],
                advantage=rng.uniform(-1, 1),
            )
        )
    return out


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """Saved float32 test models by layer layout, built on first use."""
    dirs: dict[str, str] = {}

    def get(layers: str) -> str:
        if layers not in dirs:
            out = tmp_path_factory.mktemp("qwen2") / layers
            _qwen2(dtype=torch.float32, layers=layers).save_pretrained(out)
            dirs[layers] = str(out)
        return dirs[layers]

    return get


@pytest.fixture(scope="module")
def model_dir(model_dirs):
    return model_dirs("full")


@pytest.mark.parametrize(("mode", "layers"), [("lora", "full"), ("full", "full"), ("lora", "alternating")])
def test_trainer_step_with_tree_equals_per_branch(model_dirs, mode, layers):
    """The same batch (two groups, duplicate responses, trees cut into several passes) with tree on and off: the same
    losses, gradients and step, to float32 precision; with a window far shorter than the prompts too."""
    model_dir = model_dirs(layers)
    samples = _group(6, prompt=40, response=8) + _group(3, prompt=25, response=5, seed=1)
    params, grads, metrics = {}, {}, {}
    for tree in ("on", "off"):
        cfg = TrainerConfig(model=model_dir, mode=mode, lr=1e-3, micro_batch=2, tree=tree, tree_max_tokens=90)
        trainer = Trainer(cfg)
        metrics[tree] = trainer.step(samples)
        params[tree] = [p.detach().clone() for p in trainer._trainable()]
        grads[tree] = [p.grad.clone() for p in trainer._trainable()]
    on, off = metrics["on"], metrics["off"]
    assert on["train/tree"] == 1.0 and off["train/tree"] == 0.0
    total = sum(len(s.input_ids) for s in samples)
    assert on["train/tree_token_ratio"] == off["train/tree_token_ratio"] == _prefixes(samples) / total
    for k in ("train/loss", "train/grad_norm", "train/mismatch_kl", "train/clip_frac"):
        assert on[k] == pytest.approx(off[k], rel=1e-4, abs=1e-7), k
    scale = max(float(g.abs().max()) for g in grads["off"])
    assert scale > 0
    assert max(float((a - b).abs().max()) for a, b in zip(grads["on"], grads["off"], strict=True)) < 1e-4 * scale
    moved = max(float((a - b).abs().max()) for a, b in zip(params["off"], _initial(model_dir, mode), strict=True))
    assert max(float((a - b).abs().max()) for a, b in zip(params["on"], params["off"], strict=True)) < 0.05 * moved


def _prefixes(batch: list[Sample] | list[list[int]]) -> int:
    seqs = [b.input_ids if isinstance(b, Sample) else b for b in batch]
    return len({tuple(s[: t + 1]) for s in seqs for t in range(len(s))})


def _initial(model_dir: str, mode: str) -> list[torch.Tensor]:
    return [p.detach().clone() for p in Trainer(TrainerConfig(model=model_dir, mode=mode, tree="off"))._trainable()]


def test_auto_switches_tree_on_only_when_it_pays(model_dir):
    trainer = Trainer(TrainerConfig(model=model_dir, mode="lora", tree="auto", tree_threshold=0.75))
    shared = _group(8, prompt=60, response=6)
    apart = [replace(s, input_ids=[(i + t) % VOCAB for t in range(66)]) for i, s in enumerate(shared)]  # no sharing
    plan, tree = trainer._plan(shared)
    assert tree and sorted(i for mb in plan for i in mb) == list(range(8)) and len(plan) == 1
    assert trainer._plan(apart) == ([[0, 1, 2, 3], [4, 5, 6, 7]], False)  # micro_batch=4 padded rows
    assert token_ratio([s.input_ids for s in shared]) == _prefixes(shared) / (8 * 66) < 0.3
    assert token_ratio([s.input_ids for s in apart]) == 1.0
    m = trainer.step(shared)
    assert m["train/tree"] == 1.0 and m["train/tree_token_ratio"] == _prefixes(shared) / (8 * 66)
    assert trainer.step(apart)["train/tree"] == 0.0
