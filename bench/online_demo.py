"""Does the CPU demo learn online, from a fleet hrl does not run? One command:

  1. hrl keys add fleet --run-dir RUN
  2. hrl train --recipe demo --serve --port P --run-dir RUN [-c …]     held-out success at step 0 and at the end,
                                                                       as `hrl train --recipe demo` measures it
                                                                       (train/heldout.py, the recipe's eval_tasks)
  3. python examples/online/fleet.py --url … --key …                   mini-swe-agent on the demo's training tasks,
                                                                       graded by the fleet, a quarter of the rewards
                                                                       posted late; stopped when the run ends

Usage: python bench/online_demo.py [--run-dir runs/online-demo] [--port 8100] [-c train.iterations=10] [--out F.json]
Prints held-out success before and after, the run's wall time and its online counts (late rewards, expired, reaped);
writes them as JSON with --out. Minutes to an hour on 2 CPU cores at the recipe's sizes: a bench, not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _mini() -> str:
    from hrl.runners.agents.install import install

    return str(Path(install("mini-swe-agent", "local").path[0]) / "mini")


def _wait_for(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 600) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"hrl train exited ({proc.returncode}) before serving; end of {log}:\n"
                             f"{log.read_text()[-3000:]}")  # fmt: skip
        try:
            urllib.request.urlopen(url + "/health", timeout=2).close()
            return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"hrl train did not serve at {url} within {timeout_s:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, default=Path("runs/online-demo"))
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("-c", dest="config", action="append", default=[], help="hrl train -c overrides.")
    ap.add_argument("--fleet", nargs=argparse.REMAINDER, default=[], help="More fleet.py flags (last).")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    from hrl.runners.rundir import RunDir

    if RunDir(a.run_dir).exists():
        raise SystemExit(f"{a.run_dir} holds a run already: choose another --run-dir")
    a.run_dir.mkdir(parents=True, exist_ok=True)
    log = a.run_dir.with_suffix(".log")
    hrl = [sys.executable, "-m", "hrl.cli"]
    key = subprocess.run([*hrl, "keys", "add", "fleet", "--run-dir", str(a.run_dir)], capture_output=True, text=True,
                         check=True).stdout.strip()  # fmt: skip
    url = f"http://127.0.0.1:{a.port}"
    cmd = [*hrl, "train", "--recipe", "demo", "--serve", "--port", str(a.port), "--run-dir", str(a.run_dir)]
    cmd += [f for c in a.config for f in ("-c", c)]
    t0 = time.monotonic()
    with log.open("w") as out:
        train = subprocess.Popen(cmd, stdout=out, stderr=out)
        fleet = None
        try:
            _wait_for(url, train, log)
            fleet = subprocess.Popen([sys.executable, str(ROOT / "examples/online/fleet.py"), "--url", url, "--key",
                                      key, "--tasks", str(ROOT / "recipes/demo/tasks.jsonl"), "--mini", _mini(),
                                      *a.fleet], stdout=out, stderr=out)  # fmt: skip
            rc = train.wait()
        finally:
            for p in (fleet, train):
                if p is not None and p.poll() is None:
                    p.terminate()
                    p.wait(30)
    wall = time.monotonic() - t0
    if rc != 0:
        raise SystemExit(f"hrl train failed (exit {rc}); end of {log}:\n{log.read_text()[-3000:]}")
    run = RunDir(a.run_dir)
    evals = {s: r for s, r in sorted(run.eval_rows().items()) if r.get("eval/success") is not None}
    steps = [json.loads(line) for line in (a.run_dir / "metrics.jsonl").read_text().splitlines() if "step" in line]
    last = next((m for m in reversed(steps) if "online/open" in m), {})
    (s0, first), (s1, end) = next(iter(evals.items())), list(evals.items())[-1]
    result = {
        "held_out_success": {"before": first["eval/success"], "after": end["eval/success"], "steps": [s0, s1],
                             "episodes": [first["eval/episodes"], end["eval/episodes"]]},
        "wall_s": round(wall, 1),
        "online": {k: v for k, v in last.items() if k.startswith("online/")},
        "run_dir": str(a.run_dir),
    }  # fmt: skip
    print(json.dumps(result, indent=2))
    if a.out:
        a.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
