"""The report's table stays one line a trace however long the ids: a 32-character trace id is shortened in its cell
(whole in the cell's title and in `#trace=ID`), so 160 traces are 160 short rows, not a 19,000-pixel column of
wrapped ids (measured in headless Chromium). A run with no failure says so in its failures chart, and the table's
`iter` column is named for what it counts: training steps, or the trace files given."""

from __future__ import annotations

import json
import random
import re
from html import unescape
from pathlib import Path
from typing import Any

from hrl.runners.report.builder import render_report, short_id, write_report
from hrl.runners.report.run import load_run, load_source
from tests.runners.report.test_report import CUT, ITERATIONS, DevTools, in_chromium, make_run

PER_ITERATION = 40  # 4 steps: 160 traces, and the two hand-made ones of step 0
ID_CELL = re.compile(r'<td class="id" data-sort="" title="([^"]*)">([^<]*)</td>')


def long_ids(run: Path, seed: int = 0) -> dict[str, str]:
    """Give every trace of `run` a 32-character hex id (what `hrl rollout` writes); {new id: old id}."""
    rng, renamed = random.Random(seed), {}
    for path in sorted((run / "traces").glob("*.jsonl")):
        traces = [json.loads(line) for line in path.read_text().splitlines()]
        for t in traces:
            new = f"{rng.getrandbits(128):032x}"
            renamed[new], t["trace_id"] = t["trace_id"], new
        path.write_text("".join(json.dumps(t) + "\n" for t in traces))
    return renamed


def without_failures(run: Path) -> None:
    for path in (run / "traces").glob("*.jsonl"):
        traces = [json.loads(line) for line in path.read_text().splitlines()]
        for t in traces:
            t.update(status="ok", failure_reason=None, reward=t.get("reward") or 0.0)
        path.write_text("".join(json.dumps(t) + "\n" for t in traces))


def test_a_long_trace_id_is_shortened_in_its_cell_and_whole_in_its_title(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", per_iteration=PER_ITERATION)
    ids = long_ids(run)
    html = render_report(load_run(run))
    cells = ID_CELL.findall(html)
    assert len(cells) == ITERATIONS * PER_ITERATION + 2
    for title, shown in cells:
        assert title in ids and unescape(shown) == f"{title[:8]}…{title[-4:]}" == short_id(title)
    assert short_id("seq00001") == "seq00001"  # a short id is shown whole
    for new in list(ids)[:3]:
        assert f'data-trace="{new}"' in html  # search and #trace=ID go by the whole id


def test_160_traces_are_160_one_line_rows_in_chromium(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", per_iteration=PER_ITERATION)
    ids = long_ids(run)
    url = write_report(run).resolve().as_uri()
    some = next(iter(ids))

    async def drive(cdp: DevTools) -> dict[str, Any]:
        found: dict[str, Any] = await cdp.js(
            "(() => { const rows = [...document.querySelectorAll('#traces tr.trace')];"
            " const id = rows[0].cells[0], line = parseFloat(getComputedStyle(id).lineHeight);"
            " return {rows: rows.length, tallest: Math.max(...rows.map(r => r.offsetHeight)), line: line,"
            " idWidth: id.offsetWidth, idTitle: id.title, table: document.getElementById('traces').offsetHeight}; })()"
        )
        found["cut"] = await cdp.js(CUT)
        await cdp.goto("about:blank")
        await cdp.goto(f"{url}#trace={some}")  # the whole id opens its trace
        found["opened"] = await cdp.js("[...document.querySelectorAll('tr.detail')].map(r => r.dataset.detail)")
        return found

    found = in_chromium(url, drive)
    assert found["rows"] == ITERATIONS * PER_ITERATION + 2
    assert found["tallest"] < 1.5 * found["line"] + 10, found  # one line of text and its padding, never a wrapped id
    assert found["idWidth"] <= 130, found  # 13 characters of monospace and padding (~118 px; a whole id took 152)
    assert len(found["idTitle"]) == 32
    assert found["table"] < 32 * found["rows"], found  # ~28 px a row; wrapped ids took 47 here, 6-8 lines when narrower
    assert found["cut"] == [], found["cut"]
    assert found["opened"] == [some]
    assert found["errors"] == []


def test_a_run_without_failures_says_no_failures(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    without_failures(run)
    html = render_report(load_run(run))
    chart = html[html.index('id="plot-failures"') :]
    chart = chart[: chart.index("</svg>")]
    assert ">no failures</text>" in chart and "no data yet" not in chart


def test_the_iteration_column_says_what_it_counts(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    steps = render_report(load_run(run))
    assert '<th data-col="1">step</th>' in steps and '<option value="">all steps</option>' in steps
    files = [run / "traces" / "iter-0000.jsonl", run / "traces" / "iter-0002.jsonl"]
    given = render_report(load_source(files))  # trace files, as `hrl rollout --out` writes them: no steps
    assert '<th data-col="1">file</th>' in given and '<option value="">all files</option>' in given
    assert '<option value="1">1 · iter-0002.jsonl</option>' in given
    assert 'data-sort="1" title="iter-0002.jsonl">1</td>' in given  # the cell names its file on hover
    assert '<th data-col="1">iter</th>' not in given + steps
