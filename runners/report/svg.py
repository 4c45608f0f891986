"""Inline SVG charts for the report: line charts over steps, stacked bars, histograms. Plain strings, no
dependencies; every mark carries a `<title>` so hovering shows its value."""

from __future__ import annotations

import itertools
import math
from html import escape

__all__ = ["PALETTE", "histogram", "line_chart", "stacked_bars"]

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d", "#475569", "#ea580c")
W, H = 520, 230
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 28, 44


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 10_000:
        return f"{x / 1000:.0f}k"
    if abs(x) >= 1000:
        return f"{x / 1000:.1f}k"
    return f"{x:.3g}"


def _labels(ticks: list[float]) -> list[str]:
    """Tick labels, each distinct: `_fmt`'s short form, or as many decimals as the step needs where that form
    would repeat a label (1256-1257 tokens: 1256.2, 1256.4, not 1.3k five times)."""
    short = [_fmt(t) for t in ticks]
    if len(set(short)) == len(short) or len(ticks) < 2:
        return short
    step = min(b - a for a, b in itertools.pairwise(ticks))
    decimals = max(0, -math.floor(math.log10(step))) if step > 0 else 0
    return [f"{t:.{decimals}f}" for t in ticks]


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    return [start + i * step for i in range(math.ceil((hi - start) / step) + 1)]


class _Frame:
    """Maps data to pixels inside the plot area and draws the axes."""

    def __init__(self, xlo: float, xhi: float, ylo: float, yhi: float) -> None:
        self.yt = _ticks(0.0 if 0 <= ylo <= yhi / 2 else ylo, yhi)
        self.ylo, self.yhi = self.yt[0], self.yt[-1]
        self.xlo, self.xhi = (xlo, xhi) if xhi > xlo else (xlo - 0.5, xhi + 0.5)

    def x(self, v: float) -> float:
        return LEFT + (v - self.xlo) / (self.xhi - self.xlo) * (W - LEFT - RIGHT)

    def y(self, v: float) -> float:
        return H - BOTTOM - (v - self.ylo) / (self.yhi - self.ylo) * (H - TOP - BOTTOM)

    def axes(self, xticks: list[float], xlabel: str) -> str:
        out = [f'<line class="axis" x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}"/>']
        for t, label in zip(self.yt, _labels(self.yt), strict=True):
            y = self.y(t)
            out.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}"/>')
            out.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
        for t, label in zip(xticks, _labels(xticks), strict=True):
            x = self.x(t)
            anchor = "end" if x > W - RIGHT - 20 else "middle"  # the last label ends at the plot's edge, not past it
            out.append(f'<text class="tick" x="{x:.1f}" y="{H - BOTTOM + 16}" text-anchor="{anchor}">{label}</text>')
        out.append(f'<text class="label" x="{(LEFT + W - RIGHT) / 2}" y="{H - 8}" text-anchor="middle">{xlabel}</text>')
        return "".join(out)


def _svg(chart_id: str, title: str, body: str, legend: list[str]) -> str:
    items = "".join(
        f'<span class="key"><i style="background:{PALETTE[i % len(PALETTE)]}"></i>{escape(name)}</span>'
        for i, name in enumerate(legend)
    )
    return (
        f'<figure class="chart"><figcaption>{escape(title)}</figcaption>'
        f'<svg id="{escape(chart_id)}" class="plot" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">{body}</svg>'
        f'<div class="legend">{items}</div></figure>'
    )


def _empty(chart_id: str, title: str, text: str = "no data yet") -> str:
    body = f'<text class="label" x="{W / 2}" y="{H / 2}" text-anchor="middle">{escape(text)}</text>'
    return _svg(chart_id, title, body, [])


def _step_ticks(xs: list[float]) -> list[float]:
    lo, hi = min(xs), max(xs)
    return [t for t in _ticks(lo, hi, min(8, max(1, int(hi - lo)))) if lo <= t <= hi and t == int(t)] or [lo]


def line_chart(chart_id: str, title: str, xs: list[float], series: list[tuple[str, list[float | None]]]) -> str:
    """One line per series over steps `xs` (None = no point); dots with hover titles."""
    values = [v for _, ys in series for v in ys if v is not None]
    if not xs or not values:
        return _empty(chart_id, title)
    f = _Frame(min(xs), max(xs), min(values), max(values))
    body = [f.axes(_step_ticks(xs), "step")]
    for i, (name, ys) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        pts = [(f.x(x), f.y(y), x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        if len(pts) > 1:
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py, _, _ in pts)
            body.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
        body += [
            f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{color}"><title>{escape(name)} @ step {x:g}: {y:.4g}'
            f"</title></circle>"
            for px, py, x, y in pts
        ]
    return _svg(chart_id, title, "".join(body), [name for name, _ in series])


def stacked_bars(
    chart_id: str, title: str, xs: list[float], series: list[tuple[str, list[float]]], zero: str = "all zero"
) -> str:
    """Bars per step, stacked by series (e.g. failures by reason); series that are all zero are left out. Steps
    whose every series is zero say `zero` ("no failures"); no steps at all, "no data yet"."""
    series = [(n, ys) for n, ys in series if any(ys)]
    if not xs or not series:
        return _empty(chart_id, title, zero if xs else "no data yet")
    totals = [sum(ys[j] for _, ys in series) for j in range(len(xs))]
    f = _Frame(min(xs) - 0.5, max(xs) + 0.5, 0.0, max(totals))
    bar = max(2.0, (f.x(1) - f.x(0)) * 0.7)
    body = [f.axes(_step_ticks(xs), "step")]
    base = [0.0] * len(xs)
    for i, (name, ys) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        for j, (x, v) in enumerate(zip(xs, ys, strict=True)):
            if v:
                top, bottom = f.y(base[j] + v), f.y(base[j])
                body.append(
                    f'<rect x="{f.x(x) - bar / 2:.1f}" y="{top:.1f}" width="{bar:.1f}" height="{bottom - top:.1f}" '
                    f'fill="{color}"><title>{escape(name)} @ step {x:g}: {v:g}</title></rect>'
                )
                base[j] += v
    return _svg(chart_id, title, "".join(body), [name for name, _ in series])


def histogram(chart_id: str, title: str, series: list[tuple[str, list[float]]], xlabel: str, bins: int = 24) -> str:
    """Overlaid step-histograms of each series' values on shared bins (counts on the y axis)."""
    values = [v for _, vs in series for v in vs]
    if not values:
        return _empty(chart_id, title)
    lo, hi = min(values), max(values)
    hi = hi if hi > lo else lo + 1.0
    width = (hi - lo) / bins
    counts = [[0] * bins for _ in series]
    for k, (_, vs) in enumerate(series):
        for v in vs:
            counts[k][min(bins - 1, int((v - lo) / width))] += 1
    f = _Frame(lo, hi, 0.0, max(max(c) for c in counts))
    xt = [t for t in _ticks(lo, hi) if lo <= t <= hi]
    body = [f.axes(xt, xlabel)]
    for k, (name, _) in enumerate(series):
        color = PALETTE[k % len(PALETTE)]
        for b, n in enumerate(counts[k]):
            if n:
                x0, x1, top = f.x(lo + b * width), f.x(lo + (b + 1) * width), f.y(n)
                body.append(
                    f'<rect x="{x0:.1f}" y="{top:.1f}" width="{max(1.0, x1 - x0 - 1):.1f}" height="{f.y(0) - top:.1f}" '
                    f'fill="{color}" fill-opacity="0.55"><title>{escape(name)}: {n} in [{_fmt(lo + b * width)}, '
                    f"{_fmt(lo + (b + 1) * width)})</title></rect>"
                )
    return _svg(chart_id, title, "".join(body), [f"{name} (n={len(vs)})" for name, vs in series])
