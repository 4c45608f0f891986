"""bench/gpu.py --tiny: every phase of the GPU check runs on the CPU, importing nothing the GPU image lacks but the
wheelhouse `--pack` builds (at most 60 MiB), with which hrl's own Trainer trains there; its MFU is a fraction of a
known peak or absent."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the GPU image has torch, transformers, peft and safetensors only: pydantic, vllm and hrl itself are absent
RUN = """
import runpy, sys
for name in ("pydantic", "vllm", "hrl", "docker"):
    sys.modules[name] = None  # any import of them raises ImportError
sys.argv = ["gpu.py", "--tiny"]
runpy.run_path(sys.argv_path, run_name="__main__")
""".replace("sys.argv_path", repr(str(ROOT / "bench" / "gpu.py")))
PHASES = ["probe", "hrl_trainer", "fsdp2", "embedded", "memory_plan", "sync", "lora_step", "tree", "colocate", "publish",
          "full_step"]  # fmt: skip
HRL_PHASES = ["hrl_trainer", "fsdp2", "embedded", "memory_plan"]  # hrl's own: they need the wheelhouse


def test_tiny_gpu_check_runs_every_phase_on_the_cpu(tmp_path):
    out = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    rows = {r["phase"]: r for r in (json.loads(line) for line in out.stdout.splitlines() if line.startswith("{"))}
    assert out.returncode == 1, (out.stdout, out.stderr[-3000:])  # hrl's own phases need the wheelhouse: they fail
    assert list(rows) == PHASES
    assert all(r["ok"] for name, r in rows.items() if name not in HRL_PHASES), rows
    for name in HRL_PHASES:  # each says how to bring hrl's dependencies, and the phases after it still run
        assert not rows[name]["ok"] and "--pack DIR" in rows[name]["error"], rows[name]
    assert rows["probe"]["gemm_tflops"] > 0 and rows["probe"]["device"] == "cpu"  # 3 significant figures: never 0.0
    for phase in ("lora_step", "full_step"):
        assert rows[phase]["tokens"] == 2 * 128 and rows[phase]["tokens_per_s"] > 0 and rows[phase]["peak_gib"] > 0
        assert 0 < rows[phase].get("mfu", 1) <= 1 and ("mfu" in rows[phase]) != ("mfu_note" in rows[phase])
    assert rows["lora_step"]["trainable_m"] < rows["full_step"]["trainable_m"]
    co = rows["colocate"]
    # per parameter: bf16 weight 2 + fp32 master 4 + two fp32 AdamW moments 8 bytes; per tensor, one fp32 step count
    assert co["offload_bytes"] == 14 * co["params"] + 4 * co["param_tensors"]
    assert co["share_ok"] and co["share_bytes"] == co["offload_bytes"] and co["state_equal"]
    assert not any("gib" in k for k in co)  # GPU memory figures: none on the CPU
    assert rows["sync"]["adapter_tensors"] == 2 * 7 * 2  # A and B of 7 projections in 2 layers
    assert rows["sync"]["ipc_gib_per_s"] > 0 and rows["sync"]["ipc_per_tensor_gib_per_s"] > 0
    assert 1 < rows["sync"]["ipc_buckets"] < rows["sync"]["ipc_tensors"]  # 64 KiB buckets of several tensors each
    pub = rows["publish"]
    # the same weights through the same kernels in one process give the same logprobs to the last bit; the copy's
    # own weights gave others (so the comparison can fail)
    assert pub["keys_missing"] == 0 and pub["max_abs_dlogp"] == 0.0 and pub["max_abs_dlogp_before"] > 0
    # bf16 weights (2 bytes each; every phase builds the same tiny config) plus a JSON header of about a hundred
    # bytes per tensor
    assert 2 * co["params"] < pub["bytes"] < 2 * co["params"] + 2**16
    tree = rows["tree"]  # one packed pass computes the shared prompt once, and gives the per-branch logprobs
    assert tree["tree_tokens"] == 96 + 8 * 32 and tree["branch_tokens"] == 8 * (96 + 32)
    # bf16 logits under 1 in size (init std 0.02): a rounding moves one by at most 2^-8 and a logprob by twice that,
    # so 0.1 allows 12 roundings; a wrong mask is off by > 1
    assert tree["max_abs_dlogp"] < 0.1, tree
    # both passes' bf16 logprobs are off the float64 ones by bf16 rounding, neither by a wrong mask
    assert 0 < tree["branch_vs_f64_max"] < 0.1 and 0 < tree["tree_vs_f64_max"] < 0.1, tree
    assert "| colocate | yes |" in out.stdout  # the closing table


@pytest.mark.full  # the variants beside the LoRA that test_tiny_gpu_check_runs_every_phase_on_the_cpu runs
def test_the_lora_variants_run_when_asked_for(tmp_path):
    """`--only lora_variants` (not in the default run): the trainer's LoRA step, bf16 adapters and attention-only
    adapters side by side; attention only trains fewer parameters."""
    run = RUN.replace('"--tiny"]', '"--tiny", "--only", "lora_variants"]')
    out = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert out.returncode == 0, (out.stdout, out.stderr[-3000:])
    (row,) = rows
    assert row["phase"] == "lora_variants" and row["ok"], row
    assert all(row[f"{v}_step_s"] > 0 for v in ("fp32_all", "bf16_all", "fp32_attn"))
    assert row["fp32_attn_trainable_m"] < row["fp32_all_trainable_m"] == row["bf16_all_trainable_m"]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("hrl_bench_gpu", ROOT / "bench" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Bench(tiny=True)


def test_mfu_is_a_fraction_of_a_known_peak_or_absent(bench):
    bench.gemm_tflops = 0.0  # the probe did not finish: no peak
    assert bench.mfu(1e9) == {"mfu_note": "no peak known for this device (the probe measured none)"}
    bench.gemm_tflops = 1e-3  # a measured 1 GFLOP/s
    assert bench.mfu(5e8) == {"mfu": 0.5, "mfu_basis": "measured GEMM"}
    late = bench.mfu(2e9)  # twice the measured rate: that rate was no peak
    assert "mfu" not in late and late["mfu_note"].startswith("2.0x the measured GEMM rate")


def _image_only(tmp_path: Path) -> Path:
    """A folder holding only what the GPU image has (bench/gpu.py's `image_dists`, linked from this environment):
    run with `python -S` and it on PYTHONPATH, nothing else of this environment can be imported."""
    import importlib.metadata as md

    spec = importlib.util.spec_from_file_location("hrl_bench_gpu_image", ROOT / "bench" / "gpu.py")
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    image, names = tmp_path / "image", gpu.image_dists()
    image.mkdir()
    for dist in md.distributions():
        if gpu._norm(dist.metadata["Name"]) not in names:
            continue
        for top in {f.parts[0] for f in dist.files or [] if f.parts and not f.parts[0].startswith("..")}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (image / top).exists():
                (image / top).symlink_to(source)
    return image


@pytest.mark.slow
@pytest.mark.full  # a GPU session's own first step packs and installs it again (docs/training-on-gpus.md)
def test_the_wheelhouse_lets_hrls_trainer_run_on_an_image_without_hrls_dependencies(tmp_path):
    """`--pack DIR` fetches what hrl's own phases need beyond the image (pydantic and its own; one wheel per Python
    where built), at most 60 MiB; installed with pip from that folder alone, hrl's Trainer (one process and FSDP2 on one
    rank), its embedded engine and the memory plan run in an environment that holds only the image's packages, and
    every step moves the weights (bf16 full training with a trust region included)."""
    packed = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--pack", str(tmp_path / "wheels")],
                            capture_output=True, text=True, timeout=240, cwd=tmp_path)  # fmt: skip
    assert packed.returncode == 0, packed.stderr[-3000:]
    summary = json.loads(packed.stdout.splitlines()[-1])
    assert 0 < summary["mib"] <= 60 and any(d.startswith("pydantic==") for d in summary["distributions"]), summary
    assert not any(d.split("==")[0] in ("torch", "transformers", "peft") for d in summary["distributions"])
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
                                str(tmp_path / "wheels"), "-r", str(tmp_path / "wheels" / "requirements.txt"),
                                "--target", str(site)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), str(_image_only(tmp_path))])}  # fmt: skip
    blocked = subprocess.run([sys.executable, "-S", "-c", "import pydantic"], env=env | {"PYTHONPATH": str(ROOT)},
                             capture_output=True, text=True)  # fmt: skip
    assert blocked.returncode != 0  # the environment holds nothing of this one's but what is put on its path
    out = subprocess.run([sys.executable, "-S", str(ROOT / "bench" / "gpu.py"), "--tiny", "--only", *HRL_PHASES],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)  # fmt: skip
    rows = {r["phase"]: r for r in (json.loads(line) for line in out.stdout.splitlines() if line.startswith("{"))}
    assert out.returncode == 0 and list(rows) == HRL_PHASES, (out.stdout[-3000:], out.stderr[-3000:])
    row = rows["hrl_trainer"]
    assert all(n > 0 for n in row["lora_update_norms"] + row["full_update_norms"]), row
    assert row["offload_gib"] > 0 and row["update_norm_after_onload"] > 0, row
    fsdp = rows["fsdp2"]  # one rank of FSDP2: the sharded run's steps move the weights as the unsharded run's do
    assert all(n > 0 for n in fsdp["sharded_update_norms"]) and fsdp["max_abs_dw_whole_vs_start"] > 0, fsdp
    assert fsdp["max_abs_dw_sharded_vs_whole"] <= fsdp["max_abs_dw_whole_vs_start"], fsdp
    served = rows["embedded"]  # bf16 decode vs a bf16 recompute: within a few roundings of logits under 1 in size
    assert served["engine_device"] == "cpu" and served["version_after"] == 1 and served["changed_by_publish"], served
    assert served["max_abs_dlogp_served_vs_scored"] < 0.1 and served["tokens_per_s"] > 0, served
    plan = rows["memory_plan"]  # the trainer steps while another process holds the engine's share
    assert plan["share_ok"] and plan["step_beside_share_update_norm"] > 0, plan
