"""`hrl train --dry-run` (and `hrl rollout --dry-run`) resolve the recipe, `-c` and the flags as a run does and print
what would start where (placement and cluster, engine replicas, node agents, the trainer's ranks, how weights reach
the replicas, the run dir), human or `--json`, exit 0, and start nothing: no Ray (`placement.address=auto` with no
cluster to join), no engine, no Docker, no model built, nothing written. What a run refuses from its config alone is
refused the same way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hrl.runners.rundir import RunDir

USAGE = 2
# `hrl ARGS` in a process that says, once the command is done, which of the modules that start something it imported:
# Ray to join or start a cluster, docker to reach a daemon, torch for an engine or a trainer, vllm for a server.
WATCH = ("import sys\nfrom hrl.cli.main import run\ncode = run()\n"
         "started = sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'docker', 'torch', 'vllm'})\n"
         "print('IMPORTED', started, file=sys.stderr)\nsys.exit(code)\n")  # fmt: skip
RAY_TRAINER = ("--placement", "ray", "-c", "placement.address=auto", "-c", "placement.trainer=ray",
               "-c", "trainer.nproc=4", "-c", "trainer.ranks_per_node=2", "-c", "placement.engine_replicas=3",
               "-c", "placement.replica_gpus=1", "-c", "placement.nodes=2", "-c", "train.concurrency=8",
               "-c", "placement.weights=ship", "-c", "placement.connect_timeout_s=5")  # fmt: skip


def hrl(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "HRL_CACHE": str(cwd / "cache"), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", WATCH, *argv], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=env)  # fmt: skip


def _nothing_started(out: subprocess.CompletedProcess[str], cwd: Path) -> None:
    assert "IMPORTED []" in out.stderr, out.stderr
    assert sorted(p.name for p in cwd.iterdir()) == [], "a dry run writes nothing, builds no model"


def test_a_local_plan_is_printed_and_nothing_starts(tmp_path):
    out = hrl("train", "--recipe", "demo", "--dry-run", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["placement"] == "local" and plan["cluster"] is None and plan["recipe"] == "demo"
    assert plan["engine"] == {"where": "driver", "replicas": 1, "engine": "embedded", "url": None, "gpus_each": None,
                              "cpus_each": None}  # fmt: skip
    assert plan["trainer"] == {"where": "driver", "nproc": 1, "ranks_per_node": None, "nodes": None, "bundles": None,
                               "strategy": None, "device": "auto", "backend": "auto", "mode": "lora"}  # fmt: skip
    assert plan["model"] == "hrl:tiny-agent" and plan["run_dir"].startswith("runs/demo-") and not plan["resume"]
    assert "dry run: nothing was started or written" in out.stderr
    _nothing_started(out, tmp_path)


def test_a_ray_trainer_plan_names_every_piece_and_joins_no_cluster(tmp_path):
    """`placement.address=auto` with no Ray cluster here: a run would fail to join it; the plan is printed."""
    out = hrl("train", "--recipe", "demo", *RAY_TRAINER, "--full", "--run-dir", "r", "--dry-run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = {line[:12].strip(): line[12:] for line in out.stdout.splitlines()}  # a label, then its piece
    assert lines["placement"] == "ray, joining the cluster at auto (connect timeout 5 s)"
    assert lines["engine"] == "3 embedded replica(s) as Ray actors, 1 GPU + 1 CPU each (a placement group each)"
    assert lines["node agents"] == (
        "2 (placement.nodes), one per node, each with a proxy shard, Docker and sandboxes; 8 episodes at once in all, "
        "up to 4 each"
    )
    assert lines["trainer"] == (
        "4 FSDP2 ranks as Ray actors in a placement group of 2 bundle(s), STRICT_SPREAD: 2 per node (2 nodes); the "
        "driver only orchestrates; device auto, backend nccl when the cluster has a GPU for every rank, else gloo on "
        "the CPU (trainer.device=auto); full"
    )
    assert lines["weights"].startswith("ship: sent through Ray's object store")
    assert lines["run dir"] == "r (new)"
    _nothing_started(out, tmp_path)
    out = hrl(
        "train", "--recipe", "demo", *RAY_TRAINER, "-c", "trainer.device=cpu", "--dry-run", "--json", cwd=tmp_path
    )
    plan = json.loads(out.stdout)
    assert plan["cluster"] == {"address": "auto", "connect_timeout_s": 5, "num_cpus": None}
    assert plan["trainer"] == {"where": "ray", "nproc": 4, "ranks_per_node": 2, "nodes": 2, "bundles": 2,
                               "strategy": "STRICT_SPREAD", "device": "cpu", "backend": "gloo",
                               "mode": "lora"}  # fmt: skip
    assert plan["node_agents"] == {"where": "ray", "count": 2, "episodes_per_node": 4}  # 8 at once over 2 nodes
    assert plan["weights"] == {"mode": "ship", "weight_sync": None} and plan["concurrency"] == 8
    _nothing_started(out, tmp_path)


def test_a_local_ray_cluster_and_the_nodes_ray_finds(tmp_path):
    out = hrl(
        "train", "--recipe", "demo", "--placement", "ray", "-c", "placement.num_cpus=3", "--dry-run", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "ray, on a local Ray cluster started here, 3 CPUs (stopped at the end)" in out.stdout
    assert "one per alive node (placement.nodes=0)" in out.stdout
    assert "8 episodes at once in all, ⌈8 ÷ nodes⌉ each" in out.stdout
    assert "1 rank in this process (the driver)" in out.stdout  # placement.trainer: driver, the default
    _nothing_started(out, tmp_path)


@pytest.mark.parametrize("dry", [True, False])
@pytest.mark.parametrize(
    ("extra", "needle", "hint"),
    [
        (("-c", "placement.trainer=ray"), "placement.trainer=ray places the trainer's ranks on a Ray cluster: add "
         "--placement ray", "-c KEY=VALUE"),  # the placement section's own rule
        ((*RAY_TRAINER, "-c", "trainer.nproc=6", "-c", "trainer.ranks_per_node=4"),
         "trainer.nproc=6 is not a multiple of trainer.ranks_per_node=4", "use -c trainer.nproc=8"),
        ((*RAY_TRAINER, "-c", "trainer.gpus=[0,1]"), "with placement.trainer=ray Ray gives each rank its GPU",
         "drop trainer.gpus"),
        ((*RAY_TRAINER, "--full", "--engine", "vllm", "-c", "engine_options.weight_sync=ipc"),
         "the weights live in the ranks", "weight_sync=disk"),
        (("-c", "trainer.lr=-1"), "bad -c trainer.lr=-1", "trainer.lr: AdamW learning rate"),  # a field's own bound
    ],
)  # fmt: skip
def test_what_a_run_refuses_a_dry_run_refuses(extra, needle, hint, dry, tmp_path):
    out = hrl("train", "--recipe", "demo", *extra, *(["--dry-run"] if dry else []), cwd=tmp_path)
    errors = [line for line in out.stderr.splitlines() if line.startswith("Error: ")]
    assert out.returncode == USAGE and len(errors) == 1 and needle in errors[0], out.stderr
    assert "Hint: " in out.stderr and hint in out.stderr and out.stdout == ""
    _nothing_started(out, tmp_path)  # the real run too: refused before the model is built or Ray imported


def test_json_without_dry_run_is_refused(tmp_path):
    out = hrl("train", "--recipe", "demo", "--json", cwd=tmp_path)
    assert out.returncode == USAGE and "Error: --json prints the --dry-run plan: it needs --dry-run" in out.stderr


def test_the_plan_of_a_run_to_resume_is_its_own_config(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create({"recipe": "demo", "model": "m", "tasks": "t.jsonl", "trainer": {"model": "m", "nproc": 2},
                "placement": {"kind": "ray", "engine_replicas": 2}})  # fmt: skip
    run.save_state(0, 0, None)
    before = sorted(p.name for p in run.path.iterdir())
    out = hrl("train", "--run-dir", "run", "--resume", "--dry-run", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["run_dir"] == "run" and plan["resume"] and plan["engine"]["replicas"] == 2
    assert plan["trainer"]["where"] == "driver" and plan["trainer"]["nproc"] == 2
    assert sorted(p.name for p in run.path.iterdir()) == before and "IMPORTED []" in out.stderr


def test_a_rollout_plan_has_no_trainer(tmp_path):
    argv = ("rollout", "--recipe", "demo", "--placement", "ray", "-c", "placement.engine_replicas=2", "-c",
            "placement.nodes=3", "--concurrency", "7", "--dry-run")  # fmt: skip
    out = hrl(*argv, "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["trainer"] is None and plan["weights"] is None and plan["out"] == "traces.jsonl"
    assert plan["node_agents"] == {"where": "ray", "count": 3, "episodes_per_node": 3}  # ⌈7 ÷ 3⌉
    _nothing_started(out, tmp_path)
    human = hrl(*argv, cwd=tmp_path).stdout
    assert (
        "trainer" not in human
        and "2 embedded replica(s) as Ray actors" in human
        and "traces      traces.jsonl" in human
    )
