"""`hrl report RUN_DIR` and `hrl inspect RUN_DIR` on a run directory built by hand. The report is opened in
headless Chromium (Debian's `chromium`) over the DevTools protocol: the plots and the trace table are there,
clicking a trace row shows its calls, `#trace=ID` opens one, nothing is fetched from the network, and a
screenshot is kept in the run folder as `report.png` (set HRL_ARTIFACTS=DIR to keep the run in DIR/report-run).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from hrl.runners.report.builder import render_report
from hrl.runners.report.run import load_run
from tests.runners.test_metrics import OVERLAPPING, SEQUENTIAL, call, trace

ITERATIONS, PER_ITERATION = 4, 6
V0 = 8  # policy version at step 0 (so the hand-made traces' v5-v8 tokens are 0-3 versions stale there)
REASONS = ("agent_timeout", "agent_crash", "engine_error")
PLOTS = (
    "plot-reward",
    "plot-failures",
    "plot-latency-steps",
    "plot-latency",
    "plot-prompt-tokens",
    "plot-response-tokens",
    "plot-staleness",
    "plot-versions",
    "plot-train-loss",
    "plot-train-mismatch-kl",
    "plot-train-grad-norm",
)


def synthetic_trace(tid: str, iteration: int, rng: random.Random, turns: int, base: float = 0.0) -> dict[str, Any]:
    """A linear agent: `turns` calls, each extending the last, tool gaps between them; some tokens one version old."""
    calls, t, prompt_len = [], 0.5, 0
    for k in range(turns):
        resp = [rng.randrange(100, 200) for _ in range(rng.randrange(5, 60))]
        dur, version = rng.uniform(0.3, 2.0), V0 + iteration - rng.choice((0, 0, 1))
        times = (round(t, 3), round(t + dur / 4, 3), round(t + dur, 3))
        if k == 0:
            prompt = [rng.randrange(100) for _ in range(rng.randrange(30, 300))]
            calls.append(call("c1", prompt, resp, times, versions=[[0, version]], finish="tool_calls"))
            prompt_len = len(prompt)
        else:
            suffix = [rng.randrange(100) for _ in range(rng.randrange(10, 120))]
            ref = (f"c{k}", prompt_len)
            calls.append(
                call(f"c{k + 1}", None, resp, times, ref=ref, suffix=suffix, parent=f"c{k}", versions=[[0, version]])
            )
            prompt_len += len(suffix)
        prompt_len += len(resp)
        t += dur + rng.uniform(0.2, 3.0)
    fail = rng.random() < 0.3
    outcome = {"status": "failed", "failure_reason": rng.choice(REASONS), "reward": 0.0} if fail else {}
    reward = {"reward": float(rng.random() < 0.3 + 0.15 * iteration)} if not fail else {}
    tools = [
        {"name": "bash", "started_at": c["ended_at"], "ended_at": n["started_at"]} for c, n in itertools.pairwise(calls)
    ]
    start = base + 100.0 * iteration + rng.uniform(0, 5)
    return trace(tid, calls, start, start + t + 1.0, env={"version": "2"}, tools=tools, task=f"task-{tid[-1]}") | {
        **outcome,
        **reward,
        "metadata": {"episode": tid},
    }


def make_run(root: Path, per_iteration: int = PER_ITERATION, seed: int = 0) -> Path:
    """config.json, state.json, metrics.jsonl (steps 0-2; step 3 still rolling out) and traces/iter-NNNN.jsonl."""
    rng = random.Random(seed)
    (root / "traces").mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"iterations": ITERATIONS, "trainer": {"model": "tiny-qwen"}}))
    (root / "state.json").write_text(json.dumps({"iteration": 3, "version": V0 + 3, "checkpoint": None}))
    for it in range(ITERATIONS):
        traces = [synthetic_trace(f"t{it}x{k:03d}", it, rng, rng.randrange(1, 6)) for k in range(per_iteration)]
        if it == 0:
            traces += [SEQUENTIAL, OVERLAPPING]
        lines = "".join(json.dumps(t) + "\n" for t in traces)
        (root / "traces" / f"iter-{it:04d}.jsonl").write_text(lines)
    rows = [
        {
            "step": it,
            "version": V0 + it + 1,
            "train/loss": 0.5 / (it + 1),
            "train/mismatch_kl": 1e-3 * it,
            "train/grad_norm": 1.0,
        }
        for it in range(ITERATIONS - 1)
    ]
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    keep = os.environ.get("HRL_ARTIFACTS")
    root = Path(keep) / "report-run" if keep else tmp_path / "run"
    shutil.rmtree(root, ignore_errors=True)
    return make_run(root)


# ---- the command -------------------------------------------------------------------------------------------

# `hrl report` until cli/main.py registers it: the same app, plus the command when it is missing.
_SHIM = (
    "import sys\n"
    "from hrl.cli import main, report\n"
    "if 'report' not in {c.name for c in main.app.registered_commands}:\n"
    "    main.app.command('report', epilog=report.EPILOG)(report.report)\n"
    "sys.argv[0] = 'hrl'\n"
    "main.main()\n"
)


def hrl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("COLUMNS", None)
    cmd = [sys.executable, "-c", _SHIM, *args] if args[0] == "report" else [sys.executable, "-m", "hrl.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def test_report_command_writes_one_self_contained_file(run_dir: Path):
    out = hrl("report", str(run_dir), "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["out"] == str(run_dir / "report.html")
    assert (info["steps"], info["traces"]) == (ITERATIONS, ITERATIONS * PER_ITERATION + 2)
    html = (run_dir / "report.html").read_text()
    for needle in ("http://", "https://", "<link", "src=", "@import", "fetch("):
        assert needle not in html.replace('xmlns="http://www.w3.org/2000/svg"', ""), needle
    for plot in PLOTS:
        assert f'id="{plot}"' in html
    other = run_dir / "elsewhere" / "r.html"
    human = hrl("report", str(run_dir), "--out", str(other))
    assert human.returncode == 0, human.stderr
    assert (human.stdout.strip(), other.is_file()) == (str(other), True)
    assert "traces" in human.stderr


def test_report_of_something_that_is_no_run(tmp_path: Path):
    out = hrl("report", str(tmp_path))
    assert out.returncode == 2  # a path that holds no traces is a usage error
    assert out.stderr.startswith("Error: ") and "neither a run directory nor" in out.stderr and "Hint:" in out.stderr


def test_report_and_inspect_take_what_rollout_writes(run_dir: Path, tmp_path: Path):
    """A trace file (the --out of `hrl rollout`), several files, a folder of them: one resolver for both commands."""
    one, two = run_dir / "traces" / "iter-0000.jsonl", run_dir / "traces" / "iter-0001.jsonl"
    rollout_out = tmp_path / "traces.jsonl"
    shutil.copy(one, rollout_out)
    out = hrl("report", str(rollout_out), "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert (info["out"], info["traces"], info["steps"]) == (str(tmp_path / "traces.html"), PER_ITERATION + 2, 1)
    out = hrl("report", str(one), str(two), "--out", str(tmp_path / "both.html"), "--json")
    assert out.returncode == 0, out.stderr
    assert (json.loads(out.stdout)["traces"], json.loads(out.stdout)["steps"]) == (2 * PER_ITERATION + 2, 2)
    out = hrl("inspect", str(one), str(two), "--json")
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)) == 2 * PER_ITERATION + 2
    out = hrl("inspect", str(run_dir / "traces"), "--json")  # a folder of trace files
    assert len(json.loads(out.stdout)) == ITERATIONS * PER_ITERATION + 2, out.stderr
    mixed = hrl("report", str(run_dir), str(one))
    assert mixed.returncode == 2 and "cannot be combined" in mixed.stderr, mixed.stderr


def test_a_run_whose_trace_file_a_crash_cut_is_reported_up_to_the_cut(run_dir: Path):
    """A crash mid-write cuts the last line of a step's trace file: report and inspect show the rest and say so."""
    path = run_dir / "traces" / "iter-0001.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    cut = {"file": str(path), "line": len(lines)}
    warning = f"Warning: {path}:{len(lines)}: the last line is cut short"
    out = hrl("report", str(run_dir), "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert (info["traces"], info["cut_lines"]) == (ITERATIONS * PER_ITERATION + 2 - 1, [cut])
    assert out.stderr.startswith(warning), out.stderr
    out = hrl("inspect", str(run_dir), "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r.get("cut_line") for r in rows] == [None, len(lines), None, None]
    assert rows[1]["traces"] == PER_ITERATION - 1
    assert out.stderr.startswith(warning), out.stderr


def test_a_few_hundred_traces_render_quickly(tmp_path: Path):
    make_run(tmp_path, per_iteration=100, seed=1)
    t0 = time.thread_time()  # this thread's CPU time: waiting for a busy core does not count
    html = render_report(load_run(tmp_path))
    elapsed = time.thread_time() - t0
    assert html.count('<tr class="trace"') == ITERATIONS * 100 + 2
    # ~0.2 s of CPU on a current core: 50× for a slower or shared one
    assert elapsed < 10, f"report of {ITERATIONS * 100} traces took {elapsed:.1f} s of CPU"


# ---- hrl inspect RUN_DIR -----------------------------------------------------------------------------------


def test_inspect_run_json_is_per_iteration(run_dir: Path):
    out = hrl("inspect", str(run_dir), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [d["iteration"] for d in data] == list(range(ITERATIONS))
    first = data[0]
    assert first["traces"] == PER_ITERATION + 2
    assert first["failures"]["agent_timeout"] >= 1  # OVERLAPPING timed out
    m = first["metrics"]
    assert m["train/loss"] == 0.5  # from metrics.jsonl
    assert m["train/version"] == V0  # the version published after the step, minus one
    assert m["trace/staleness/max"] == 3  # SEQUENTIAL's oldest token is v5
    assert m["trace/staleness/min"] in (0, 1)  # synthetic traces: v8, some tokens v7
    for key in ("trace/reward", "trace/latency_s/p50", "trace/tool_latency_s/p95", "trace/response_tokens/max"):
        assert key in m
    last = data[3]["metrics"]  # step 3 has no metrics line yet: traces only, trained by state.json's version
    assert "train/loss" not in last
    assert (last["trace/count"], last["train/version"]) == (PER_ITERATION, V0 + 3)


def test_inspect_run_human(run_dir: Path):
    out = hrl("inspect", str(run_dir))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert any(ch in out.stdout for ch in "▁▂▃▄▅▆▇█")
    for needle in ("reward", "failed", "tool p50", "staleness", "loss", f"{ITERATIONS} iterations"):
        assert needle in out.stdout, needle
    tree = hrl("inspect", str(run_dir), "--trace", "seq0")
    assert tree.returncode == 0, tree.stderr
    assert "c1  @" in tree.stdout and "tool bash" in tree.stdout


# ---- in a browser ------------------------------------------------------------------------------------------


def chromium() -> str:
    """The Chromium binary; a clear failure (not a skip) when it is missing: CI must have it."""
    for name in (os.environ.get("HRL_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    pytest.fail("Chromium is not installed: `apt-get install -y chromium` (Debian; .ci/setup.sh installs it)")


class DevTools:
    """A tiny Chrome DevTools Protocol client over aiohttp's websocket: commands, and the events seen so far."""

    def __init__(self, ws: Any) -> None:
        self.ws, self.next_id, self.events = ws, 0, []

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            msg = json.loads((await asyncio.wait_for(self.ws.receive(), 30)).data)
            if msg.get("id") == self.next_id:
                assert "error" not in msg, msg
                return dict(msg.get("result", {}))
            self.events.append(msg)

    async def js(self, expression: str) -> Any:
        res = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in res, res
        return res["result"].get("value")

    async def goto(self, url: str) -> None:
        """Navigate and wait for the page's script to finish (`body[data-ready]`; about: pages just load)."""
        await self.send("Page.navigate", url=url)
        done = "document.readyState === 'complete'" + (
            "" if url.startswith("about:") else " && document.body.dataset.ready === '1'"
        )
        for _ in range(100):
            if await self.js(done):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"the report never finished loading: {url}")

    async def click(self, selector: str) -> None:
        """A real mouse click in the middle of the element (scrolled into view first)."""
        box = await self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center'}});"
            " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)


WIDTH = 1400  # a laptop's window: the report must fit it


async def screenshot(cdp: DevTools) -> bytes:
    """The whole page as PNG, the window stretched to its height (at most 8000 px)."""
    height = (await cdp.send("Page.getLayoutMetrics"))["cssContentSize"]["height"]
    await cdp.send(
        "Emulation.setDeviceMetricsOverride",
        width=WIDTH,
        height=min(int(height), 8000),
        deviceScaleFactor=1,
        mobile=False,
    )
    png = await cdp.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    return base64.b64decode(png["data"])


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


# What is cut at the window: every element whose box ends right of it, or that hides part of its content sideways
# (in a scroll box of its own, or clipped, with an ellipsis or not). `[tag#id.class, right edge, px hidden]`.
CUT = """[...document.querySelectorAll('body *')].filter(e => e.getClientRects().length).map(e => {
  const r = e.getBoundingClientRect(), over = e.scrollWidth - e.clientWidth;
  const hides = over > 1 && getComputedStyle(e).overflowX !== 'visible';
  return [e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.className && e.className.baseVal === undefined
    ? '.' + e.className.split(' ').join('.') : ''), Math.round(r.right), hides ? over : 0];
}).filter(([, right, over]) => right > innerWidth || over > 0)"""


GOLDEN = Path(__file__).parents[2] / "golden" / "chat-sse.jsonl"  # recorded through the real proxy, tiny tokenizer

# Each text block of the opened conversations as a reader sees it: [label, innerText (rendered), height in px].
READ = """[...document.querySelectorAll('tr.detail .conversation .block')].map(b =>
  [b.querySelector('.label').innerText, b.querySelector('pre').innerText, b.querySelector('pre').offsetHeight])"""


def golden_trace(model: str) -> dict[str, Any]:
    """The golden trace as a rollout writes it: naming the model it was sampled from."""
    from hrl.runners.trace import read_traces

    (trace,) = list(read_traces(GOLDEN))
    return {**trace, "model": {"name": model}}


def assert_readable(blocks: list[list[Any]]) -> None:
    """The golden trace's conversation on the page: the model's reply, its tool call with arguments, laid out (not
    folded away), line breaks real and no escaped `\\n` left."""
    labels = [label for label, _, _ in blocks]
    assert "says" in labels and "tool call bash" in labels, labels
    assert [json.loads(t)["command"] for label, t, _ in blocks if label == "tool call bash"][:1] == ["ls -la"]
    assert all(h > 0 for _, _, h in blocks)
    assert any("\n" in text for _, text, _ in blocks) and not any("\\n" in text for _, text, _ in blocks)


def in_chromium(url: str, drive: Callable[[DevTools], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """Open `url` in headless Chromium at 1400 × 1000 px and run `drive` on the page; what it returns, plus the page's
    uncaught exceptions (`errors`) and the URL schemes it requested (`requests`)."""
    binary = chromium()
    with tempfile.TemporaryDirectory(
        prefix="hrl-chromium-", ignore_cleanup_errors=True
    ) as profile:  # its helpers may write late
        flags = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "--remote-allow-origins=*",
            "about:blank",
        ]
        proc = subprocess.Popen([binary, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            port = _wait_for_port(Path(profile), proc)
            return asyncio.run(asyncio.wait_for(_session(url, port, drive), 120))
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _session(url: str, port: int, drive: Callable[[DevTools], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
            page = next(t for t in await r.json() if t["type"] == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            cdp = DevTools(ws)
            for domain in ("Page", "Runtime", "Network"):
                await cdp.send(f"{domain}.enable")
            await cdp.send(
                "Emulation.setDeviceMetricsOverride", width=WIDTH, height=1000, deviceScaleFactor=1, mobile=False
            )
            await cdp.goto(url)
            found = await drive(cdp)
            found["errors"] = [e["params"] for e in cdp.events if e.get("method") == "Runtime.exceptionThrown"]
            found["requests"] = sorted(
                {
                    e["params"]["request"]["url"].split(":", 1)[0]
                    for e in cdp.events
                    if e.get("method") == "Network.requestWillBeSent"
                }
            )
            return found


def _wait_for_port(profile: Path, proc: subprocess.Popen[bytes]) -> int:
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if marker.is_file() and (text := marker.read_text().split()):
            return int(text[0])
        if proc.poll() is not None:
            raise AssertionError(f"chromium exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        time.sleep(0.1)
    raise AssertionError("chromium did not open its DevTools port within 60 s")


def test_report_in_headless_chromium(run_dir: Path, tiny_model: str):
    """Read what is on the page, click a trace, then a decodable one (the golden trace among the run's) and read its
    conversation, screenshot, open one by URL hash, filter."""
    with (run_dir / "traces" / "iter-0000.jsonl").open("a") as f:
        f.write(json.dumps(golden_trace(tiny_model)) + "\n")
    golden = golden_trace(tiny_model)["trace_id"]
    out = hrl("report", str(run_dir))
    assert out.returncode == 0, out.stderr
    url = (run_dir / "report.html").resolve().as_uri()

    async def drive(cdp: DevTools) -> dict[str, Any]:
        found: dict[str, Any] = await cdp.js(
            "({plots: [...document.querySelectorAll('svg.plot')].map(s => [s.id, s.querySelectorAll("
            "'circle, rect, polyline').length]), rows: document.querySelectorAll('#traces tr.trace').length})"
        )
        await cdp.click('tr.trace[data-trace="seq00001"]')
        found["opened"] = await cdp.js(
            "({calls: [...document.querySelectorAll('tr.detail[data-detail=\"seq00001\"] tr.call')].map(r => r.dataset.call),"
            " tools: document.querySelectorAll('tr.detail[data-detail=\"seq00001\"] tr.tool').length,"
            " turns: document.querySelectorAll('tr.detail[data-detail=\"seq00001\"] details.turn').length,"
            " hash: location.hash})"
        )
        found["width"] = await cdp.js("document.documentElement.scrollWidth")  # with a trace's detail open
        await cdp.click('tr.trace[data-trace="seq00001"]')  # folded again: the screenshot shows the readable one
        await cdp.click(f'tr.trace[data-trace="{golden}"]')
        found["blocks"] = await cdp.js(READ)
        found["cut"] = await cdp.js(CUT)
        found["png"] = await screenshot(cdp)
        await cdp.goto("about:blank")
        await cdp.goto(url + "#trace=ovl00002")
        found["from_hash"] = await cdp.js(
            "[...document.querySelectorAll('tr.detail tr.call')].map(r => r.dataset.call)"
        )
        found["filtered"] = await cdp.js(
            "(() => { const s = document.getElementById('search'); s.value = 'ovl00002';"
            " s.dispatchEvent(new Event('input')); return document.querySelectorAll('#traces tr.trace:not([hidden])').length; })()"
        )
        return found

    found = in_chromium(url, drive)
    (run_dir / "report.png").write_bytes(found["png"])  # kept in the run folder: the CI artifact
    plots = dict(found["plots"])
    for plot in PLOTS:
        assert plots.get(plot, 0) > 0, f"{plot} missing or empty: {plots}"
    assert found["rows"] == ITERATIONS * PER_ITERATION + 3
    assert_readable(found["blocks"])
    assert found["opened"] == {"calls": ["c1", "c2", "s1", "c3"], "tools": 2, "turns": 4, "hash": "#trace=seq00001"}
    assert found["width"] <= WIDTH  # the page never scrolls sideways: wide tables scroll in their own box
    assert found["cut"] == []  # nor does any table: all of it fits at 1400 px, no cell cut short
    assert found["from_hash"] == ["a1", "b1", "a2"]
    assert found["filtered"] == 1
    assert found["errors"] == []
    assert set(found["requests"]) <= {"file", "about", "data"}, found["requests"]
    width, height = png_size(found["png"])
    assert width == WIDTH and height > 1000, (width, height)
