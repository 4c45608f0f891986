"""The soak benchmark's 30-second version: 256 concurrent streaming sessions through the real proxy in a child
process, with hang-ups and 5 % malformed requests. No well-formed request fails, no malformed one gets a 5xx, and
every ended session is exactly one trace (`python bench/proxy_soak.py --help` for the 10-minute run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "proxy_soak.py"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_soak_30s_256_sessions(tiny_model):
    out = subprocess.run(
        [sys.executable, str(BENCH), "--model", tiny_model, "--sessions", "256", "--seconds", "30", "--json"],
        capture_output=True, text=True, timeout=380,
    )  # fmt: skip
    assert out.stdout.strip(), out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\nsoak: {result}")
    assert result["errors"] == 0, result["error_samples"]
    assert result["bad_5xx"] == 0 and result["bad_4xx"] == result["bad"] > 0
    # throughput floors: a loaded core serves ~100 requests/s here (~40 of them ending a session), so 30 s gives
    # ~3000 and ~1200; the floors ask for every one of the 256 sessions to have ended once, and 2 requests each
    assert result["traces_written"] == result["ended"] > 256
    assert result["hangups"] > 0 and result["ok"] > 2 * 256  # 5 % hang up: none in 512 has odds 0.95^512 ≈ 4e-12
    assert "Error handling request" not in out.stderr, out.stderr[-3000:]
    assert out.returncode == 0
