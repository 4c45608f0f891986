"""Task sampling by signal: the weight formula, the success counts and their prior, the weighted draw without
replacement; balanced sampling over a task field's strata; and `train.task_sampler` as a checked config key."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from pydantic import ValidationError

from hrl.runners.errors import UsageError
from hrl.runners.recipe_keys import check_key
from hrl.train.loop import LoopConfig, _batch
from hrl.train.sampler import Strata, TaskStats, entropy, signal_weight, weighted_sample
from hrl.train.trainer import TrainerConfig


@pytest.mark.parametrize("g", [2, 4, 8])
def test_signal_weight_is_zero_at_the_ends_and_largest_at_one_half(g):
    assert signal_weight(0.0, g) == 0.0 and signal_weight(1.0, g) == 0.0
    assert signal_weight(0.5, g) == pytest.approx(1 - 2 * 0.5**g)
    grid = [i / 100 for i in range(101)]
    assert max(grid, key=lambda p: signal_weight(p, g)) == 0.5
    assert signal_weight(0.3, g) == pytest.approx(signal_weight(0.7, g))  # symmetric in success and failure
    assert signal_weight(0.1, g) < signal_weight(0.3, g) < signal_weight(0.5, g)
    assert signal_weight(0.5, 1) == 0.0  # one episode never has two rewards to compare


def _trace(task: str, reward: float | None, failure: str | None = None) -> dict:
    return {"task_id": task, "reward": reward, "failure_reason": failure, "calls": []}


def test_counts_use_a_beta_1_1_prior_and_skip_traces_without_a_reward():
    stats = TaskStats(success_reward=1.0)
    assert stats.rate("new") == 0.5  # never seen: the prior's mean, the largest weight
    stats.observe([_trace("a", 1.0)] * 3 + [_trace("b", 0.0)] * 3 + [_trace("c", 1.0), _trace("c", 0.0)])
    stats.observe([_trace("a", None, "sandbox_error"), _trace("b", None, "cancelled")])  # no score: not counted
    assert stats.rate("a") == 4 / 5 and stats.rate("b") == 1 / 5 and stats.rate("c") == 0.5
    partial = TaskStats(success_reward=0.5)
    partial.observe([_trace("d", 0.6), _trace("d", 0.4)])  # a reward ≥ success_reward is a success
    assert partial.rate("d") == 0.5
    tasks = [{"instance_id": t} for t in "abcx"]
    w = stats.weights(tasks, 4)
    assert w[0] == w[1] < w[2] == w[3]  # solved and failed alike weigh less; unseen and mixed the most
    assert stats.weights(tasks, 1) == [1.0] * 4  # no task can carry signal: all alike


def test_a_sampler_key_pools_the_counts_of_a_family_of_tasks():
    """train.sampler_key=demo.op: a trace of one `+` task moves the rate of every `+` task, and of no other; a task
    without the field counts alone."""
    tasks = [{"instance_id": f"p{i}", "demo": {"op": "+"}} for i in range(3)]
    tasks += [{"instance_id": "m0", "demo": {"op": "min"}}, {"instance_id": "x"}]
    stats = TaskStats(1.0, tasks, "demo.op")
    stats.observe([_trace("p0", 1.0), _trace("p1", 0.0), _trace("p1", 0.0), _trace("x", 1.0)])
    assert [stats.rate(t) for t in ("p0", "p1", "p2")] == [2 / 5] * 3
    assert stats.rate("m0") == 0.5 and stats.rate("x") == 2 / 3
    w = stats.weights(tasks, 4)
    assert w[0] == w[1] == w[2] != w[3]
    assert TaskStats(1.0, tasks, "").family == {}  # no key: per task, as before


def test_weighted_sample_is_distinct_seeded_and_proportional():
    items = list(range(5))
    weights = [1.0, 1.0, 1.0, 1.0, 0.0]
    for seed in range(50):
        got = weighted_sample(items, weights, 3, random.Random(seed))
        assert len(set(got)) == 3 and 4 not in got  # without replacement; weight 0 only once the rest are taken
        assert got == weighted_sample(items, weights, 3, random.Random(seed))
    assert sorted(weighted_sample(items, weights, 9, random.Random(0))) == items
    firsts = Counter(weighted_sample([0, 1], [3.0, 1.0], 1, random.Random(s))[0] for s in range(4000))
    assert firsts[0] / 4000 == pytest.approx(0.75, abs=0.03)  # seeded; and ±4.4σ of a binomial over 4000


def test_signal_batches_favour_tasks_of_middling_success():
    """20 tasks whose success rates run from 0 to 1: over 400 iterations the signal sampler picks the middle ones
    far more often than the ends, and the uniform sampler does not."""
    tasks = [{"instance_id": f"t{i}"} for i in range(20)]
    stats = TaskStats()
    for i in range(20):  # 18 episodes each, i of 19 → 0 … 18 successes
        n_ok = round(18 * i / 19)
        stats.observe([_trace(f"t{i}", 1.0)] * n_ok + [_trace(f"t{i}", 0.0)] * (18 - n_ok))
    picks = {}
    for sampler in ("signal", "uniform"):
        cfg = LoopConfig(tasks_per_iteration=4, group_size=4, task_sampler=sampler, trainer=TrainerConfig(model="m"))
        eps = [e for it in range(400) for e in _batch(tasks, cfg, it, stats) if e.index == 0]
        assert all(len({e.task_id for e in eps[i : i + 4]}) == 4 for i in range(0, len(eps), 4))  # 4 distinct
        picks[sampler] = Counter(e.task_id for e in eps)
    ends = [f"t{i}" for i in (0, 1, 18, 19)]
    middle = [f"t{i}" for i in (8, 9, 10, 11)]
    signal, uniform = picks["signal"], picks["uniform"]
    print(f"\nsignal: middle {sum(signal[t] for t in middle)}, ends {sum(signal[t] for t in ends)}; "
          f"uniform: middle {sum(uniform[t] for t in middle)}, ends {sum(uniform[t] for t in ends)}")  # fmt: skip
    assert sum(signal[t] for t in middle) > 2 * sum(signal[t] for t in ends)
    assert sum(uniform[t] for t in middle) < 1.5 * sum(uniform[t] for t in ends)


def test_entropy_is_one_for_uniform_weights_and_lower_when_concentrated():
    assert entropy([1.0] * 8) == pytest.approx(1.0)
    assert entropy([1.0, 0.0, 0.0, 0.0]) == 0.0
    assert 0 < entropy([4.0, 1.0, 1.0, 1.0]) < 1


def test_task_sampler_is_a_checked_config_key():
    assert LoopConfig(task_sampler="signal", trainer=TrainerConfig(model="m")).task_sampler == "signal"
    with pytest.raises(ValidationError, match="'uniform', 'signal' or 'balanced'"):
        LoopConfig(task_sampler="greedy", trainer=TrainerConfig(model="m"))
    check_key("train.task_sampler", "signal", {})  # what `-c train.task_sampler=signal` checks
    check_key("train.success_reward", 0.5, {})
    with pytest.raises(UsageError, match=r"train\.task_sampler='greedy'") as info:
        check_key("train.task_sampler", "greedy", {})
    assert "signal" in info.value.hint


def _families(sizes: dict[str, int]) -> list[dict]:
    return [{"instance_id": f"{fam}-{i}", "demo": {"bug": fam}} for fam, n in sizes.items() for i in range(n)]


def test_balanced_batches_give_every_family_the_same_share_whatever_its_size():
    """Families of 1, 3, 10 and 60 tasks and 2 without the field: uniform sampling gives the big one 79 % of the
    groups; balanced gives each of the 5 strata a fifth, every batch of 5 holds all 5, and a family of one is trained
    as often as the rest."""
    tasks = [*_families({"a": 1, "b": 3, "c": 10, "d": 60}), {"instance_id": "x-0"}, {"instance_id": "x-1"}]
    cfg = LoopConfig(tasks_per_iteration=5, group_size=2, task_sampler="balanced", sampler_key="demo.bug",
                     trainer=TrainerConfig(model="m"))  # fmt: skip
    share: Counter[str] = Counter()
    for it in range(50):
        firsts = [e for e in _batch(tasks, cfg, it) if e.index == 0]
        fams = [e.task.get("demo", {}).get("bug", "") for e in firsts]
        assert len({e.task_id for e in firsts}) == len(set(fams)) == 5
        share.update(fams)
    assert share == {"a": 50, "b": 50, "c": 50, "d": 50, "": 50}  # tasks without the field are one stratum
    again = [e.task_id for it in range(50) for e in _batch(tasks, cfg, it)]
    assert again == [e.task_id for it in range(50) for e in _batch(tasks, cfg, it)]  # by (seed, iteration) alone
    other = cfg.model_copy(update={"seed": 1})
    assert again != [e.task_id for it in range(50) for e in _batch(tasks, other, it)]


def test_balanced_picks_depend_on_the_group_number_alone():
    """What a resumed run (sync or async: groups numbered past the committed ones) relies on; a batch's own picks
    avoid a task already taken where its stratum has another."""
    tasks = _families({"a": 2, "b": 2})
    strata = Strata(tasks, "demo.bug")
    assert strata.values == ["a", "b"]
    picks = [strata.pick(0, g)["instance_id"] for g in range(40)]
    assert picks == [strata.pick(0, g)["instance_id"] for g in range(40)]
    assert all({picks[i][0], picks[i + 1][0]} == {"a", "b"} for i in range(0, 40, 2))  # each round: both strata
    first = strata.pick(0, 0)
    assert strata.pick(0, 0, [first["instance_id"]]) != first  # its stratum's other task
    assert strata.pick(0, 0, ["a-0", "a-1", "b-0", "b-1"])["instance_id"][0] == first["instance_id"][0]


def test_balanced_needs_a_key():
    with pytest.raises(ValidationError, match=r"set train\.sampler_key"):
        LoopConfig(task_sampler="balanced", trainer=TrainerConfig(model="m"))


def test_async_groups_take_the_strata_in_turn_by_group_number(tmp_path):
    """The async loop draws one group at a time, numbered run-wide: balanced picks its task by that number, so
    groups 0–7 cover the 8 strata once and a resumed producer (new groups numbered on) draws what one run would."""
    from hrl.runners.rundir import RunDir
    from hrl.train.async_loop import AsyncConfig, _Producer

    tasks = _families({f"op{i}": i + 1 for i in range(8)})
    cfg = LoopConfig(group_size=2, task_sampler="balanced", sampler_key="demo.bug", trainer=TrainerConfig(model="m"))
    producer = _Producer(tasks, cfg, AsyncConfig(), None, RunDir(tmp_path / "run"))
    groups = [next(producer._groups) for _ in range(16)]
    assert [len(g) for g in groups] == [2] * 16 and all(g[0].task_id == g[1].task_id for g in groups)
    fams = [g[0].task["demo"]["bug"] for g in groups]
    assert sorted(fams[:8]) == sorted(fams[8:]) == [f"op{i}" for i in range(8)]
    strata = Strata(tasks, "demo.bug")
    assert [g[0].task_id for g in groups] == [strata.pick(0, n)["instance_id"] for n in range(16)]
