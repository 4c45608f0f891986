"""bench/embedded_speed.py --tiny: both batching modes' TTFT rows (static: the call arriving mid-decode waits for the
long one's last token; continuous: it does not), throughput rows and the bandwidth bound, as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_bench_reports_ttft_throughput_and_the_bandwidth_bound(tmp_path):
    out = tmp_path / "speed.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "embedded_speed.py"), "--tiny", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    static, continuous = res["ttft"]["static"], res["ttft"]["continuous"]
    long_tokens = res["sizes"]["long_tokens"]
    assert static["a_tokens"] == continuous["a_tokens"] == long_tokens
    assert static["a_tokens_at_b_first_token"] == long_tokens  # static: B waited for A's last token
    assert continuous["a_tokens_at_b_first_token"] < long_tokens  # continuous: B's first token came mid-A
    assert all(row["b_ttft_s"] > 0 for row in (static, continuous))
    assert [r["batch"] for r in res["throughput"]] == res["sizes"]["batches"]
    for row in res["throughput"]:
        assert row["generated"] == row["batch"] * res["sizes"]["decode_tokens"]
        assert row["prefill_tok_s"] > 0 and row["decode_tok_s"] > 0
    bw = res["bandwidth"]
    assert bw["copy_bytes_per_s"] > 0 and bw["weight_bytes"] > 0
    assert abs(bw["decode_bound_tok_s_batch1"] - bw["copy_bytes_per_s"] / bw["weight_bytes"]) < 0.01
    assert res["machine"]["cores"] >= 1 and "| static |" in proc.stdout
