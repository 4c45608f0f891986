"""`hrl report` of what `hrl rollout --out` writes: a golden trace (tests/golden, recorded through the real proxy
with the tiny model's tokenizer) as a report with no per-step charts, its model and policy-version cards filled
from the trace, and the conversation decoded, with real newlines, in the trace's detail."""

from __future__ import annotations

import json
import os
import re
import shutil
from html import unescape
from pathlib import Path
from typing import Any

from hrl.runners.trace import read_traces
from tests.runners.report.test_report import (
    CUT,
    GOLDEN,
    PLOTS,
    READ,
    WIDTH,
    DevTools,
    assert_readable,
    golden_trace,
    hrl,
    in_chromium,
    make_run,
    png_size,
    screenshot,
)

STEP_PLOTS = [p for p in PLOTS if p not in ("plot-latency", "plot-prompt-tokens", "plot-response-tokens")]


def _rollout_file(tmp_path: Path, model: str) -> Path:
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(golden_trace(model)) + "\n")
    return path


def _facts(html: str) -> dict[str, str]:
    return {k: unescape(v) for v, k in re.findall(r'<div class="fact"><b>(.*?)</b><span>(.*?)</span>', html)}


def _conversation(html: str, n: int = 0) -> str:
    m = re.search(rf'<template class="conversation" data-n="{n}">(.*?)</template>', html, re.S)
    assert m, "no conversation template"
    return m.group(1)


def test_a_rollout_file_has_no_step_charts_and_cards_from_its_traces(tmp_path: Path, tiny_model: str):
    out = hrl("report", str(_rollout_file(tmp_path, tiny_model)), "--json")
    assert out.returncode == 0, out.stderr
    html = Path(json.loads(out.stdout)["out"]).read_text()
    for plot in STEP_PLOTS:
        assert f'id="{plot}"' not in html, plot
    assert 'id="plot-latency"' in html and 'id="plot-response-tokens"' in html  # distributions over traces stay
    assert "no training steps in this input" in html
    facts = _facts(html)
    assert facts["model"] == tiny_model
    assert facts["policy version"] == "v0–v1"  # call c5 was sampled across a publish: versions 0 then 1
    assert "steps" not in facts and facts["files"] == "1"
    ticks = re.findall(
        r'class="tick" x="[^"]*" y="202" text-anchor="\w+">([^<]*)<',
        html.split('id="plot-prompt-tokens"')[1].split("</svg>")[0],
    )
    assert len(ticks) > 1 and len(set(ticks)) == len(ticks), ticks  # one trace, one value: still distinct labels


def test_the_conversation_is_decoded_with_real_newlines(tmp_path: Path, tiny_model: str):
    out = hrl("report", str(_rollout_file(tmp_path, tiny_model)), "--json")
    assert out.returncode == 0, out.stderr
    conv = _conversation(Path(json.loads(out.stdout)["out"]).read_text())
    (trace,) = list(read_traces(GOLDEN))
    assert conv.count('<details class="turn"') == len(trace["calls"])  # one fold per call
    assert '<div class="label">tool call bash</div><pre>{"command": "ls -la"}</pre>' in conv
    assert "&lt;tool_response&gt;\nok\n&lt;/tool_response&gt;" in conv  # the tool result, newlines real
    assert "\\n" not in conv  # no escaped newline anywhere in what the page shows
    assert "token counts only" not in conv


def test_without_a_tokenizer_the_report_says_so_and_shows_counts(tmp_path: Path):
    out = hrl("report", str(_rollout_file(tmp_path, "org/not-on-this-machine")), "--json")
    assert out.returncode == 0, out.stderr
    html = Path(json.loads(out.stdout)["out"]).read_text()
    assert "Conversations show token counts only" in html and "org/not-on-this-machine" in html
    assert _conversation(html).count('<details class="turn"') == 5
    assert _facts(html)["model"] == "org/not-on-this-machine"


def test_a_training_run_keeps_its_step_charts(tmp_path: Path):
    from hrl.runners.report.builder import render_report
    from hrl.runners.report.run import load_run

    html = render_report(load_run(make_run(tmp_path / "run", per_iteration=2)))
    assert all(f'id="{p}"' in html for p in PLOTS) and "no training steps" not in html
    facts = _facts(html)
    assert (facts["steps"], facts["model"], facts["policy version"]) == ("4", "tiny-qwen", "11")  # config, state


def test_tables_fit_the_window_in_their_own_box():
    """A layout rule, read from the page's CSS (the headless-browser test measures it at 1400 px)."""
    from importlib import resources

    css = resources.files("hrl.runners.report").joinpath("template.html").read_text()
    wrap = re.search(r"\.wrap \{([^}]*)\}", css).group(1)  # type: ignore[union-attr]
    assert "max-width: calc(100vw" in wrap and "overflow-x: auto" in wrap
    assert "white-space: pre-wrap" in css


def test_past_its_text_budget_the_page_shows_counts(tiny_model: str):
    from hrl.runners.conversation import load_template
    from hrl.runners.report.conversation import conversation_templates

    (trace,) = list(read_traces(GOLDEN))
    template, _ = load_template(tiny_model)
    html = conversation_templates([trace, {**trace, "trace_id": "second"}], template, None, budget=1)
    first, second = _conversation(html, 0), _conversation(html, 1)
    assert "tool call bash" in first and "token counts only" not in first  # decoded: the budget was not spent yet
    assert "tool call bash" not in second and "characters of text are spent" in second


def test_a_rollout_file_in_headless_chromium(tmp_path: Path, tiny_model: str):
    """What `hrl rollout --out` writes, as a report at 1400 px: cards filled, the trace's conversation opened and
    readable (real line breaks, the model's reply, a tool call), nothing cut at the window's edge; the screenshot is
    kept beside the file (HRL_ARTIFACTS=DIR: in DIR/report-rollout)."""
    keep = os.environ.get("HRL_ARTIFACTS")
    root = Path(keep) / "report-rollout" if keep else tmp_path
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    out = hrl("report", str(_rollout_file(root, tiny_model)), "--json")
    assert out.returncode == 0, out.stderr
    page = Path(json.loads(out.stdout)["out"])
    (trace,) = list(read_traces(GOLDEN))

    async def drive(cdp: DevTools) -> dict[str, Any]:
        found: dict[str, Any] = {
            "cards": await cdp.js(
                "Object.fromEntries([...document.querySelectorAll('.fact')].map(f => "
                "[f.querySelector('span').innerText, f.querySelector('b').innerText]))"
            )
        }
        await cdp.click(f'tr.trace[data-trace="{trace["trace_id"]}"]')
        found["blocks"] = await cdp.js(READ)
        found["cut"] = await cdp.js(CUT)
        found["png"] = await screenshot(cdp)
        return found

    found = in_chromium(page.as_uri(), drive)
    page.with_suffix(".png").write_bytes(found["png"])  # the CI artifact, beside the report
    assert found["cards"]["model"] == tiny_model and found["cards"]["policy version"] == "v0–v1"
    assert_readable(found["blocks"])
    assert found["cut"] == []  # no element past 1400 px, none hiding content in a sideways scroll
    assert found["errors"] == [] and set(found["requests"]) <= {"file", "about", "data"}, found["requests"]
    width, height = png_size(found["png"])
    assert width == WIDTH and height > 1000, (width, height)
