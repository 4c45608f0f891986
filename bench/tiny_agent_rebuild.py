"""The shipped tiny agent model rebuilt from scratch: the whole build, or the start of it that CI checks.

python bench/tiny_agent_rebuild.py [--out bench/results/tiny_agent_rebuild-full.json]
    `hrl models tiny-agent DIR --verify --json` (10-20 minutes on two cores): byte for byte on the builder's kind
    of CPU, the same model by behaviour elsewhere (train/tiny/verify.py). Writes its result with the time taken.

python bench/tiny_agent_rebuild.py --record-start tests/train/tiny/rebuild_start.json
    Records the start of the build that the test suite compares with (`rebuild_start`: the first START_STEPS
    losses), here; then the same start with torch's AVX2 and unvectorised kernels (ATEN_CPU_CAPABILITY), which
    round as other CPUs do and must stay within START_RTOL, and with a learning rate 1 % higher, which must not.
    Run it again whenever the build changes (the config key in the record then differs from the build's).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _start(variant: str) -> dict:
    """One `rebuild_start` in a fresh process (ATEN_CPU_CAPABILITY is read when torch loads)."""
    env, lr = dict(os.environ), None
    if variant in ("avx2", "default"):
        env["ATEN_CPU_CAPABILITY"] = variant
    elif variant == "lr_plus_1pct":
        lr = 1.01
    code = (
        "import json, sys, tempfile\n"
        "from hrl.train.tiny.agent import TinyAgentConfig, machine\n"
        "from hrl.train.tiny.verify import rebuild_start\n"
        f"cfg = TinyAgentConfig(); cfg = cfg.model_copy(update={{'lr': cfg.lr * {lr}}}) if {lr!r} else cfg\n"
        "with tempfile.TemporaryDirectory() as d:\n"
        "    r = rebuild_start(d + '/m', cfg=cfg)\n"
        "import torch\n"
        "print(json.dumps(r | {'capability': torch.backends.cpu.get_cpu_capability(), 'machine': machine()}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.exit(f"rebuild_start ({variant}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def record_start(path: Path) -> None:
    from hrl.train.tiny.agent import TinyAgentConfig
    from hrl.train.tiny.verify import START_RTOL, START_STEPS, start_within

    here = _start("here")
    if bad := [r["file"] for r in here["files"] if not r["same"]]:
        sys.exit(f"the build's files differ from the shipped build's before training: {bad}")
    record = {
        "what": "the first losses of the shipped tiny agent build trained from scratch (train/tiny/verify.py)",
        "command": "python bench/tiny_agent_rebuild.py --record-start " + str(path),
        "date": datetime.date.today().isoformat(),
        "key": TinyAgentConfig().key(),
        "steps": START_STEPS,
        "machine": here["machine"],
        "losses": here["losses"],
        "seconds": here["seconds"],
        "checked": {},
    }
    for variant in ("avx2", "default", "lr_plus_1pct"):
        other = _start(variant)
        ok, worst = start_within(other["losses"], here["losses"])
        record["checked"][variant] = {"capability": other["capability"], "losses": other["losses"],
                                      "max_rel_diff": worst, "within": ok}  # fmt: skip
        print(f"{variant:14s} capability {other['capability']:8s} max rel diff {worst:.1e} "
              f"({'within' if ok else 'beyond'} {START_RTOL:g})", file=sys.stderr)  # fmt: skip
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"recorded {path} ({here['seconds']} s a start)", file=sys.stderr)


def full(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        args = [sys.executable, "-m", "hrl.cli", "models", "tiny-agent", f"{tmp}/m", "--verify", "--json"]
        proc = subprocess.run(args, capture_output=True, text=True, check=False)
        seconds = round(time.monotonic() - t0, 1)
    if not proc.stdout.strip():
        sys.exit(f"hrl models tiny-agent --verify printed nothing (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result = {"command": "hrl models tiny-agent DIR --verify --json", "date": datetime.date.today().isoformat(),
              "seconds": seconds, "load": os.getloadavg(), "exit": proc.returncode} | result  # fmt: skip
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'verified' if result.get('verified') else 'NOT verified'} ({result.get('mode')}) in {seconds} s; "
          f"written to {out}", file=sys.stderr)  # fmt: skip
    sys.exit(0 if result.get("verified") else 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "tiny_agent_rebuild-full.json")
    p.add_argument("--record-start", type=Path, metavar="PATH", help="record the start of the build instead")
    a = p.parse_args()
    record_start(a.record_start) if a.record_start else full(a.out)


if __name__ == "__main__":
    main()
