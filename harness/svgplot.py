"""Line charts as plain SVG text: the report's only plots.

No dependency (a fresh `pip install -e .` has torch and the base dependencies only, and a report without
its loss curve would hide what a reader looks for first): axes, a few ticks and polylines.
"""

import html
import math
from collections.abc import Sequence

__all__ = ["line_chart"]

_PALETTE = ("#1f6feb", "#d97706", "#1a7f37", "#cf222e", "#8250df", "#6e7781")


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count - 1, 1)
    step = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * step:
            step *= mult
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def line_chart(series: Sequence[tuple[str, Sequence[tuple[float, float]]]], *, title: str, xlabel: str, ylabel: str,
               width: int = 540, height: int = 300) -> str:
    """An SVG document with one polyline per (label, points) series; empty series are skipped."""
    left, right, top, bottom = 62, 14, 28, 42
    points = [(x, y) for _, pts in series for x, y in pts if math.isfinite(x) and math.isfinite(y)]
    e = html.escape
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
             f"font-family='Helvetica, Arial, sans-serif' font-size='11'>",
             f"<rect width='{width}' height='{height}' fill='white'/>",
             f"<text x='{width / 2}' y='16' text-anchor='middle' font-size='13'>{e(title)}</text>"]
    plot_w, plot_h = width - left - right, height - top - bottom
    if not points:
        parts.append(f"<text x='{width / 2}' y='{height / 2}' text-anchor='middle' fill='#888'>no data</text></svg>")
        return "".join(parts)
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    if x1 == x0:
        x1 = x0 + 1
    pad = (y1 - y0) * 0.05 or abs(y0) * 0.05 or 1.0
    y0, y1 = y0 - pad, y1 + pad

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * plot_h

    for y in _ticks(y0, y1):
        parts.append(f"<line x1='{left}' x2='{left + plot_w}' y1='{sy(y):.1f}' y2='{sy(y):.1f}' stroke='#eaeef2'/>"
                     f"<text x='{left - 6}' y='{sy(y) + 4:.1f}' text-anchor='end' fill='#57606a'>{_fmt(y)}</text>")
    for x in _ticks(x0, x1, 6):
        parts.append(f"<line x1='{sx(x):.1f}' x2='{sx(x):.1f}' y1='{top}' y2='{top + plot_h}' stroke='#eaeef2'/>"
                     f"<text x='{sx(x):.1f}' y='{top + plot_h + 15}' text-anchor='middle' fill='#57606a'>{_fmt(x)}</text>")
    parts.append(f"<rect x='{left}' y='{top}' width='{plot_w}' height='{plot_h}' fill='none' stroke='#8c959f'/>")
    parts.append(f"<text x='{left + plot_w / 2}' y='{height - 8}' text-anchor='middle'>{e(xlabel)}</text>")
    parts.append(f"<text transform='translate(14 {top + plot_h / 2}) rotate(-90)' text-anchor='middle'>{e(ylabel)}</text>")
    for i, (label, pts) in enumerate(s for s in series if s[1]):
        color = _PALETTE[i % len(_PALETTE)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts if math.isfinite(x) and math.isfinite(y))
        parts.append(f"<polyline fill='none' stroke='{color}' stroke-width='1.8' points='{coords}'/>")
        if len(series) > 1:
            parts.append(f"<text x='{left + 8}' y='{top + 14 + 14 * i}' fill='{color}'>{e(label)}</text>")
    parts.append("</svg>")
    return "".join(parts)
