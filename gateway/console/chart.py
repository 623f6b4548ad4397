"""Bars per day and a meter, as server-drawn SVG: no script, no style attribute (CSP).

The text inside an SVG scales with it; console.css sizes it per chart and width so that a
label is never under 11 px on screen (a 720-unit chart drawn 360 px wide halves it).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, timedelta

from model_gateway.gateway.console.html import esc, usd

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 720, 230, 30, 30, 34  # TOP: room for the axis top's label
SMALL_WIDTH, SMALL_HEIGHT = 480, 180  # the overview's trend: two charts side by side
METER_WIDTH = 1000  # a meter's SVG user units


def _nice_ceiling(value: int) -> int:
    """The axis top: 1, 2 or 5 times a power of ten, at least the largest bar."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def days_between(first: date, last: date) -> list[date]:
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def day_bars(
    days: list[date],
    by_day: dict[str, int],
    *,
    label: str,
    shown: Callable[[int], str],
    small: bool = False,
) -> str:
    """A bar per day of `by_day` (ISO date -> integer); each bar's title is the day and
    `shown(value)`, the axis top `shown(top)`."""
    width, height = (SMALL_WIDTH, SMALL_HEIGHT) if small else (WIDTH, HEIGHT)
    top = _nice_ceiling(max([*by_day.values(), 1]))
    plot_w, plot_h = width - LEFT - 8, height - BOTTOM - TOP
    slot = plot_w / len(days)
    bars, labels = [], []
    every = max(1, -(-len(days) // (5 if small else 6)))  # few date labels: read on a phone
    for n, day in enumerate(days):
        value = by_day.get(day.isoformat(), 0)
        bar_h = plot_h * value / top
        x = LEFT + n * slot + slot * 0.15
        title = f"{day.isoformat()}: {shown(value)}"
        bars.append(
            f'<rect class="bar" x="{x:.1f}" y="{TOP + plot_h - bar_h:.1f}"'
            f' width="{slot * 0.7:.1f}" height="{max(bar_h, 0):.1f}"'
            f' data-day="{day.isoformat()}" data-value="{value}"><title>{esc(title)}</title></rect>'
        )
        if n % every == 0:
            labels.append(
                f'<text x="{LEFT + n * slot + slot / 2:.1f}" y="{height - 8}"'
                f' text-anchor="middle">{day.strftime("%d %b")}</text>'
            )
    axis = (
        f'<line class="axis" x1="{LEFT}" y1="{TOP + plot_h}" x2="{width - 8}"'
        f' y2="{TOP + plot_h}"/>'
        f'<line class="grid" x1="{LEFT}" y1="{TOP}" x2="{width - 8}" y2="{TOP}"/>'
        f'<text x="{width - 8}" y="{TOP - 6}" text-anchor="end">{esc(shown(top))}</text>'
    )
    kind = "chart small" if small else "chart"
    return (
        f'<svg class="{kind}" viewBox="0 0 {width} {height}" role="img"'
        f' aria-label="{esc(label)}">{axis}{"".join(bars)}{"".join(labels)}</svg>'
    )


def cost_chart(first: date, last: date, cost_by_day: dict[str, int]) -> str:
    return day_bars(days_between(first, last), cost_by_day, label="Cost per day", shown=usd)


def meter(part: int, whole: int, label: str) -> str:
    """`part` of `whole` as a bar (exact integers, capped at full); over it, the bar is
    marked `over`."""
    filled = 0 if whole <= 0 else min(METER_WIDTH, part * METER_WIDTH // whole)
    over = " over" if whole > 0 and part > whole else ""
    return (
        f'<svg class="meter{over}" viewBox="0 0 {METER_WIDTH} 14" preserveAspectRatio="none"'
        f' role="img" aria-label="{esc(label)}">'
        f'<rect class="track" width="{METER_WIDTH}" height="14"></rect>'
        f'<rect class="fill" width="{filled}" height="14"></rect></svg>'
    )
