"""examples/clusters/ stays a working set of launchers: each file has the shape its scheduler reads (the `#SBATCH`
lines before the first command and a `ray symmetric-run` over one task per node; a KubeRay `RayJob` whose pods share
with their Docker sidecar the paths hrl bind-mounts; a SkyPilot task that starts Ray's head and workers), the three
end in the same `hrl train` command, that command fits the GPUs the file asks for, and it runs here with `--dry-run`
appended (as `HRL_EXTRA_ARGS` does on the cluster): exit 0, the trainer's ranks as Ray actors, nothing started."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli.test_dry_run import hrl

CLUSTERS = Path(__file__).resolve().parents[2] / "examples" / "clusters"
EXTRA = "${HRL_EXTRA_ARGS}"
ENTRY = ["hrl", "train", "--recipe", "swe", "--placement", "ray", "-c", "placement.address=auto", "-c",
         "placement.trainer=ray"]  # fmt: skip


def _commands(script: str) -> list[str]:
    """A shell script's commands, each on one line (backslash continuations joined), comments left out."""
    return [line for line in script.replace("\\\n", " ").splitlines() if not line.lstrip().startswith("#")]


def _hrl_train(tokens: list[str]) -> list[str]:
    """The `hrl train …` at the end of a command line (after `ray symmetric-run … --`, say)."""
    start = next(i for i in range(len(tokens)) if tokens[i : i + 2] == ["hrl", "train"])
    return tokens[start:]


def _bash_syntax(script: str) -> None:
    out = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def slurm() -> tuple[list[str], int, int]:
    """The sbatch script's hrl command, its nodes and GPUs per node, its structure checked."""
    text = (CLUSTERS / "slurm.sbatch").read_text()
    _bash_syntax(text)
    lines = text.splitlines()
    first_command = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    directives = {
        k: v for k, _, v in (x.removeprefix("#SBATCH ").partition("=") for x in lines if x.startswith("#SBATCH "))
    }
    assert all(i < first_command for i, line in enumerate(lines) if line.startswith("#SBATCH")), "Slurm stops there"
    assert directives["--ntasks-per-node"] == "1"  # one `ray symmetric-run` per node
    [run] = [shlex.split(line) for line in _commands(text) if "symmetric-run" in line]
    assert run[:3] == ["srun", "--nodes=$SLURM_JOB_NUM_NODES", "--ntasks-per-node=1"]
    assert run[3:5] == ["ray", "symmetric-run"] and run[run.index("--min-nodes") + 1] == "$SLURM_JOB_NUM_NODES"
    cmd = _hrl_train(run)
    assert run[run.index(cmd[0], 5) - 1] == "--"  # the separator symmetric-run requires before the entrypoint
    return cmd, int(directives["--nodes"]), int(directives["--gpus-per-node"])


def _pods(job: dict[str, Any]) -> list[tuple[dict[str, Any], int]]:
    """Each pod template of the RayJob's cluster and how many such pods: the head, then each worker group."""
    spec = job["spec"]["rayClusterSpec"]
    return [(spec["headGroupSpec"]["template"]["spec"], 1),
            *((g["template"]["spec"], g["replicas"]) for g in spec["workerGroupSpecs"])]  # fmt: skip


def kuberay() -> tuple[list[str], int, int]:
    """The RayJob's hrl command, its GPU pods and GPUs per pod, its structure checked."""
    job = yaml.safe_load((CLUSTERS / "kuberay-rayjob.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["rayClusterSpec"]["workerGroupSpecs"]
    assert spec["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    [submitter] = spec["submitterPodTemplate"]["spec"]["containers"]
    assert {"name": "HRL_EXTRA_ARGS", "value": ""} in submitter["env"]  # applied as is, it trains
    gpu_pods = []
    for pod, count in _pods(job):
        ray, dind = pod["containers"]
        assert "REPLACE_ME" in ray["image"] and "REPLACE_ME" in submitter["image"]  # the placeholders stand out
        assert dind["securityContext"]["privileged"] and dind["image"].startswith("docker:")
        env = {e["name"]: e["value"] for e in ray["env"]}
        mounts = {m["name"]: m["mountPath"] for m in ray["volumeMounts"]}
        theirs = {m["name"]: m["mountPath"] for m in dind["volumeMounts"]}
        assert mounts["tmp"] == theirs["tmp"] == "/tmp" and mounts["cache"] == theirs["cache"] == env["HRL_CACHE"]
        assert (
            env["DOCKER_HOST"] == f"unix://{mounts['dind-socket']}/docker.sock" and theirs["dind-socket"] == "/var/run"
        )
        assert {v["name"] for v in pod["volumes"]} >= set(mounts)
        gpus = int(ray["resources"]["limits"].get("nvidia.com/gpu", 0))
        gpu_pods += [gpus] * count if gpus else []
    assert gpu_pods and len(set(gpu_pods)) == 1
    return shlex.split(spec["entrypoint"]), len(gpu_pods), gpu_pods[0]


def skypilot() -> tuple[list[str], int, int]:
    """The SkyPilot task's hrl command, its nodes and GPUs per node, its structure checked."""
    task = yaml.safe_load((CLUSTERS / "skypilot.yaml").read_text())
    assert task["envs"]["HRL_EXTRA_ARGS"] == ""
    assert "'hrl[ray]'" in task["setup"]
    _bash_syntax(task["setup"])
    _bash_syntax(task["run"])
    run = task["run"]
    assert all(v in run for v in ("SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES"))
    assert "ray start --head --port 6379" in run and 'ray start --address "$head_ip:6379"' in run
    [cmd] = [shlex.split(line) for line in _commands(run) if line.strip().startswith("hrl train")]
    assert (
        run.index("ray start --head") < run.index('-ge "$SKYPILOT_NUM_NODES"') < run.index("hrl train")
    )  # waits first
    _, per_node = task["resources"]["accelerators"].split(":")  # NAME:COUNT
    return cmd, int(task["num_nodes"]), int(per_node)


LAUNCHERS = {"slurm.sbatch": slurm, "kuberay-rayjob.yaml": kuberay, "skypilot.yaml": skypilot}


def _without_run_dir(cmd: list[str]) -> list[str]:
    i = cmd.index("--run-dir")
    return cmd[:i] + cmd[i + 2 :]


def test_the_three_launchers_run_the_same_command():
    commands = {name: read()[0] for name, read in LAUNCHERS.items()}
    for name, cmd in commands.items():
        assert cmd[: len(ENTRY)] == ENTRY and cmd[-1] == EXTRA, (name, cmd)
        assert not [t for t in cmd[:-1] if "$" in t], f"{name}: the command runs as written, but for {EXTRA}"
    assert len({tuple(_without_run_dir(c)) for c in commands.values()}) == 1, commands


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_a_launcher_command_plans_the_trainer_on_ray_actors_and_fits_its_gpus(name, tmp_path):
    cmd, nodes, gpus_per_node = LAUNCHERS[name]()
    out = hrl(*cmd[1:-1], "--dry-run", "--json", cwd=tmp_path)  # `HRL_EXTRA_ARGS="--dry-run --json"`
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    trainer, engine = plan["trainer"], plan["engine"]
    assert plan["placement"] == "ray" and plan["cluster"]["address"] == "auto"
    assert trainer["where"] == "ray" and trainer["strategy"] == "STRICT_SPREAD"
    assert trainer["nodes"] <= nodes and trainer["ranks_per_node"] <= gpus_per_node  # one bundle per distinct node
    assert trainer["nproc"] + engine["replicas"] * engine["gpus_each"] <= nodes * gpus_per_node  # a GPU per rank
    assert engine["where"] == "ray" and engine["engine"] == "vllm"
    assert "IMPORTED []" in out.stderr and list(tmp_path.iterdir()) == []  # nothing joined, started or written
    human = hrl(*cmd[1:-1], "--dry-run", cwd=tmp_path)
    [line] = [x for x in human.stdout.splitlines() if x.startswith("trainer")]
    assert human.returncode == 0 and "8 FSDP2 ranks as Ray actors" in line and "4 per node (2 nodes)" in line, line
