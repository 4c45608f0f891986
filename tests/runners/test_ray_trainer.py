"""`placement.trainer: ray` on a two-node Ray cluster (simulated on this machine): the trainer's two gloo ranks are
Ray actors on two distinct nodes; a step equals the single-process step to 1e-6; the checkpoint comes back to the
driver through Ray (no folder shared with the ranks) and `--resume` sends it back; a rank killed mid-run is an error
naming its rank and node, not a hang; and `hrl train` itself trains and publishes with its ranks on two nodes, the
replicas serving the published version from checkpoints shipped to their nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hrl.config import PlacementConfig
from hrl.runners.errors import HrlError, UsageError
from hrl.train.trainer import Trainer, TrainerConfig
from tests.train.test_distributed import _batch4, _weights

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def _trainable(trainer: Trainer) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten() for p in trainer._trainable()])


def test_two_ranks_on_two_nodes_take_the_single_process_step(ray_cluster, tiny_model, tmp_path):
    from hrl.train.ray_group import RayTrainerGroup

    cfg = TrainerConfig(model=tiny_model, mode="lora", lr=3e-5, micro_batch=1, device="cpu", nproc=2)
    one = Trainer(cfg.model_copy(update={"nproc": 1}))
    single = one.step(_batch4())
    one.save(tmp_path / "single")

    group = RayTrainerGroup(cfg, PlacementConfig(kind="ray", trainer="ray"))
    try:
        assert len({r["node_id"] for r in group.ranks}) == 2, group.ranks  # one rank per node
        assert [r["rank"] for r in group.ranks] == [0, 1]
        assert all(r["devices"] == ["cpu"] for r in group.ranks)
        sharded = group.step(_batch4())
        torch.testing.assert_close(torch.tensor(sharded["train/loss"]), torch.tensor(single["train/loss"]),
                                   rtol=0, atol=1e-6)  # fmt: skip
        ckpt = group.save(tmp_path / "ckpt")
        names = sorted(p.name for p in ckpt.iterdir())
        assert {"adapter_config.json", "adapter_model.safetensors", "optimizer-rank0-of-2.pt",
                "optimizer-rank1-of-2.pt"} <= set(names), names  # fmt: skip
        a, b = _weights(tmp_path / "single"), _weights(ckpt)
        assert a.keys() == b.keys() and a
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6)
        with pytest.raises(UsageError, match="ipc"):
            group.named_weights()
        assert group.lr_info()["train/lr"] == pytest.approx(3e-5)
    finally:
        group.close()

    resumed = RayTrainerGroup(cfg, PlacementConfig(kind="ray", trainer="ray"))  # --resume: from the driver's files
    try:
        resumed.load(tmp_path / "ckpt")
        again, ref = resumed.step(_batch4()), one.step(_batch4())
        torch.testing.assert_close(torch.tensor(again["train/loss"]), torch.tensor(ref["train/loss"]),
                                   rtol=0, atol=1e-6)  # fmt: skip
        resumed.save(tmp_path / "ckpt2")
        one.save(tmp_path / "single2")
        a, b = _weights(tmp_path / "single2"), _weights(tmp_path / "ckpt2")
        for k in a:  # the optimizer's moments came back too: the second step matches as well
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6)
    finally:
        resumed.close()


def test_a_rank_that_dies_is_an_error_naming_it(ray_cluster, tiny_model):
    import ray

    from hrl.train.ray_group import RayTrainerGroup

    cfg = TrainerConfig(model=tiny_model, mode="lora", micro_batch=1, device="cpu", nproc=2)
    group = RayTrainerGroup(cfg, PlacementConfig(kind="ray", trainer="ray"))
    try:
        node = group.ranks[1]["node_id"][:12]
        ray.kill(group.actors[1])
        with pytest.raises(HrlError, match=rf"trainer rank 1 on node {node}.* died during step") as e:
            group.step(_batch4())
        assert "--resume" in (e.value.hint or "")
    finally:
        group.close()
    assert not ray.util.placement_group_table(group.group) or (
        ray.util.placement_group_table(group.group)["state"] == "REMOVED"
    )


def test_hrl_train_with_its_ranks_on_two_nodes_trains_and_publishes(ray_cluster, tmp_path):
    """The CLI, joined to the two-node cluster: one iteration, the two ranks on distinct nodes (placement.json), the
    checkpoint shipped to each replica's node and served there at the new version."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "hrl.cli", "train", "--recipe", "demo", "--iterations", "1", "--placement", "ray",
           "--run-dir", str(run), "-c", f"placement.address={ray_cluster.address}", "-c", "placement.trainer=ray",
           "-c", "trainer.nproc=2", "-c", "placement.engine_replicas=2", "-c", "placement.weights=ship",
           "-c", "train.tasks_per_iteration=1", "-c", "train.group_size=2", "-c", "eval_tasks=",
           # a step that always trains, whatever the two episodes score: the dense signal of a teacher (the model
           # itself: near zero, never all zero), so the step, its checkpoint and the publish always happen
           "-c", "train.advantage=distill", "-c", "distill.teacher=hrl:tiny-agent"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=540, env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    placed = json.loads((run / "placement.json").read_text())
    assert placed["trainer"] == "ray" and placed["weights"] == "ship"
    assert len({r["node_id"] for r in placed["trainer_ranks"]}) == 2, placed
    assert len(placed["replicas"]) == 2 and all(r["url"] for r in placed["replicas"])
    state = json.loads((run / "state.json").read_text())
    assert state["version"] == 1 and Path(state["checkpoint"]).is_dir()
    assert (Path(state["checkpoint"]) / "optimizer-rank1-of-2.pt").is_file()
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1]["version"] == 1 and not steps[-1].get("train/empty"), steps[-1]
    assert steps[-1]["distill/tokens"] > 0
    # the checkpoint reached both replicas' nodes through Ray and both serve version 1
    assert steps[-1]["publish/replicas_acked"] == 2 and steps[-1]["publish/replicas_fenced"] == 0
    assert steps[-1]["publish/shipped_bytes"] > 0 and steps[-1]["publish/ship_failed"] == 0
