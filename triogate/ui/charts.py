"""Charts drawn as SVG on the server: stacked daily bars and histograms.

Every label goes through :func:`~triogate.ui.html.el`, so a key alias in a legend is text.
Each bar carries a ``<title>`` (the browser shows it on hover) and the chart an
``aria-label``; under each chart a ``<details>`` table holds the same numbers, for screen
readers and for anyone who wants the figures (no script: the browser opens it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from triogate.ui.html import Html, el

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

#: Distinguishable colours (colour-blind friendly, after Okabe & Ito), then grey for "other".
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
           "#000000")
OTHER = "#9aa3ad"
_W, _H = 720, 240
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 12, 12, 36


def nice_max(value: float) -> float:
    """A round axis maximum at or above ``value`` (1, 2, 2.5 or 5 times a power of ten)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** (len(str(int(value))) - 1) if value >= 1 else 1.0
    while power > value:
        power /= 10
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power


def _font(width: int) -> str:
    # Text keeps its size on the page whether the drawing is narrow or wide.
    return "11" if width > 900 else "13"


def usd_axis(top: float) -> Callable[[float], str]:
    """Dollar labels with as many decimals as the axis's step needs ($0.000025, $2.50)."""
    step = top / 4
    decimals = 0
    while decimals < 9 and abs(round(step, decimals) - step) > step * 1e-9:
        decimals += 1
    decimals = max(2, decimals)
    return lambda v: f"${v:,.{decimals}f}"


def usd_exact(value: float) -> str:
    return f"${value:,.6f}" if value < 1 else f"${value:,.2f}"


def _left(top: float, fmt: Callable[[float], str], width: int = _W) -> int:
    """Room for the longest axis label ($0.000025 needs more than 20)."""
    longest = max(len(fmt(top * i / 4)) for i in range(5))
    return max(_LEFT, round(longest * int(_font(width)) * 0.62) + 10)


def _axis(top: float, fmt: Callable[[float], str], width: int = _W,
          left: int = _LEFT) -> list[Html]:
    parts: list[Html] = []
    plot_h = _H - _TOP - _BOTTOM
    for i in range(5):
        value = top * i / 4
        y = _TOP + plot_h - plot_h * i / 4
        parts.append(el("line", x1=left, x2=width - _RIGHT, y1=f"{y:.1f}", y2=f"{y:.1f}",
                        stroke="#e3e7ec", stroke_width="1"))
        parts.append(el("text", fmt(value), x=left - 6, y=f"{y + 4:.1f}", text_anchor="end",
                        font_size=_font(width), fill="#5b6670"))
    return parts


def stacked_bars(
    columns: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    label: str,
    top_n: int = 7,
    width: int = _W,
) -> Html:
    """One bar per column (a day), stacked by series (a key, a team...), with a legend.

    Values are USD. Series beyond the ``top_n`` largest are summed into "other".
    ``width`` is the drawing's width in its own units: wider for a full-width panel, so
    the text keeps its size.
    """
    if not columns or not series:
        return el("p", "No data for this period.", class_="empty")
    ranked = sorted(series.items(), key=lambda kv: -sum(kv[1]))
    shown = list(ranked[:top_n])
    if len(ranked) > top_n:
        rest = [sum(vals[i] for _, vals in ranked[top_n:]) for i in range(len(columns))]
        shown.append(("other", rest))
    colours = [PALETTE[i % len(PALETTE)] for i in range(min(len(shown), top_n))]
    if len(shown) > top_n:
        colours.append(OTHER)
    totals = [sum(vals[i] for _, vals in shown) for i in range(len(columns))]
    top = 4 * nice_max(max(totals) / 4)  # four round steps
    fmt = usd_axis(top)
    left = _left(top, fmt, width)
    plot_w = width - left - _RIGHT
    plot_h = _H - _TOP - _BOTTOM
    slot = plot_w / len(columns)
    bar_w = max(2.0, min(48.0, slot * 0.7))
    parts = _axis(top, fmt, width, left)
    for i, column in enumerate(columns):
        x = left + slot * i + (slot - bar_w) / 2
        y: float = _TOP + plot_h
        for (name, vals), colour in zip(shown, colours, strict=True):
            if vals[i] <= 0:
                continue
            h = plot_h * vals[i] / top
            y -= h
            parts.append(el("rect", el("title", f"{column} · {name}: {usd_exact(vals[i])}"),
                            x=f"{x:.1f}", y=f"{y:.1f}", width=f"{bar_w:.1f}",
                            height=f"{max(h, 0.5):.1f}", fill=colour))
        every = max(1, len(columns) // 10)
        last = len(columns) - 1
        # Every few days a date, and the last day's; none crowding the last.
        if (i % every == 0 and last - i >= every) or i == last:
            parts.append(el("text", column[5:] if len(column) == 10 else column,
                            x=f"{x + bar_w / 2:.1f}", y=_H - _BOTTOM + 16, text_anchor="middle",
                            font_size=_font(width), fill="#5b6670"))
    legend = el("ul", [el("li", _swatch(colour),
                          el("span", name)) for (name, _), colour in zip(shown, colours,
                                                                         strict=True)],
                class_="legend")
    svg = el("svg", el("title", label), parts, viewBox=f"0 0 {width} {_H}", role="img",
             aria_label=label, class_="chart", preserveAspectRatio="xMidYMid meet")
    names = [name for name, _ in shown]
    rows = [[column, *(usd_exact(vals[i]) if vals[i] else "—" for _, vals in shown),
             usd_exact(totals[i])] for i, column in enumerate(columns) if totals[i] > 0]
    return el("figure", svg, legend, _numbers(label, ["Day", *names, "Total"], rows),
              class_="chart-figure")


def _numbers(label: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> Html:
    """The chart's figures as a table, folded under it."""
    head = el("tr", [el("th", h, scope="col") for h in headers])
    body = [el("tr", [el("td", c) for c in row]) for row in rows]
    return el("details", el("summary", "The numbers"),
              el("div", el("table", el("caption", label), el("thead", head), el("tbody", body)),
                 class_="table-wrap"), class_="numbers")


def _swatch(colour: str) -> Html:
    # An SVG square: the page's CSP allows no inline style attributes.
    return el("svg", el("rect", width="12", height="12", rx="2", fill=colour), width="12",
              height="12", aria_hidden="true", class_="swatch")


def histogram(buckets: Sequence[tuple[str, float]], *, label: str, colour: str = PALETTE[0],
              highlight: Sequence[str] = ()) -> Html:
    """Bars of counts per bucket (labels under the bars); ``highlight`` buckets in green."""
    if not buckets or not any(count for _, count in buckets):
        return el("p", "No requests yet.", class_="empty")
    # Whole-number ticks: a step of 1, 2, 5, 10... and four of them.
    step = max(1.0, nice_max(max(count for _, count in buckets) / 4))
    top = 4 * (step if step == int(step) else math.ceil(step))
    plot_w = _W - _LEFT - _RIGHT
    plot_h = _H - _TOP - _BOTTOM
    slot = plot_w / len(buckets)
    bar_w = slot * 0.75
    parts = _axis(top, lambda v: f"{v:,.0f}")
    for i, (name, count) in enumerate(buckets):
        x = _LEFT + slot * i + (slot - bar_w) / 2
        h = plot_h * count / top
        fill = PALETTE[2] if name in highlight else colour
        parts.append(el("rect", el("title", f"{name}: {count:,.0f} requests"), x=f"{x:.1f}",
                        y=f"{_TOP + plot_h - h:.1f}", width=f"{bar_w:.1f}",
                        height=f"{max(h, 0.5 if count else 0):.1f}", fill=fill))
        parts.append(el("text", name, x=f"{x + bar_w / 2:.1f}", y=_H - _BOTTOM + 16,
                        text_anchor="middle", font_size=_font(_W), fill="#5b6670"))
    svg = el("svg", el("title", label), parts, viewBox=f"0 0 {_W} {_H}", role="img",
             aria_label=label, class_="chart")
    return Html(svg + _numbers(label, ["Redis waits", "Requests"],
                               [[name, f"{count:,.0f}"] for name, count in buckets if count]))
