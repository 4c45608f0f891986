"""bench/gpu.py --tiny: every phase of the GPU check runs on the CPU, importing nothing the GPU image lacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the GPU image has torch, transformers, peft and safetensors only: pydantic, vllm and hrl itself are absent
RUN = """
import runpy, sys
for name in ("pydantic", "vllm", "hrl"):
    sys.modules[name] = None  # any import of them raises ImportError
sys.argv = ["gpu.py", "--tiny"]
runpy.run_path(sys.argv_path, run_name="__main__")
""".replace("sys.argv_path", repr(str(ROOT / "bench" / "gpu.py")))


def test_tiny_gpu_check_runs_every_phase_on_the_cpu(tmp_path):
    out = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    rows = {r["phase"]: r for r in (json.loads(line) for line in out.stdout.splitlines() if line.startswith("{"))}
    assert out.returncode == 0, (out.stdout, out.stderr[-3000:])
    assert list(rows) == ["probe", "lora_step", "full_step", "sync", "tree"]
    assert all(r["ok"] for r in rows.values()), rows
    assert rows["probe"]["gemm_tflops"] > 0 and rows["probe"]["device"] == "cpu"  # 3 significant figures: never 0.0
    for phase in ("lora_step", "full_step"):
        assert rows[phase]["tokens"] == 2 * 128 and rows[phase]["tokens_per_s"] > 0 and rows[phase]["peak_gib"] > 0
    assert rows["lora_step"]["trainable_m"] < rows["full_step"]["trainable_m"]
    assert rows["sync"]["adapter_tensors"] == 2 * 7 * 2  # A and B of 7 projections in 2 layers
    assert rows["sync"]["ipc_gib_per_s"] > 0
    tree = rows["tree"]  # one packed pass computes the shared prompt once, and gives the per-branch logprobs
    assert tree["tree_tokens"] == 96 + 8 * 32 and tree["branch_tokens"] == 8 * (96 + 32)
    # bf16 logits under 1 in size (init std 0.02): a rounding moves one by at most 2^-8 and a logprob by twice that,
    # so 0.1 allows 12 roundings; a wrong mask is off by > 1
    assert tree["max_abs_dlogp"] < 0.1, tree
    assert "| full_step | yes |" in out.stdout  # the closing table
