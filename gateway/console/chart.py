"""Cost per day as a server-drawn SVG bar chart: no script, no style attribute (CSP)."""

from __future__ import annotations

from datetime import date, timedelta

from model_gateway.gateway.console.html import esc
from model_gateway.gateway.metering.money import format_amount

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 720, 220, 30, 30, 22


def _nice_ceiling(micros: int) -> int:
    """The axis top: 1, 2 or 5 times a power of ten, at least the largest bar."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= micros:
                return step * factor
        step *= 10


def cost_chart(first: date, last: date, cost_by_day: dict[str, int]) -> str:
    days = [first + timedelta(days=n) for n in range((last - first).days + 1)]
    top = _nice_ceiling(max([*cost_by_day.values(), 1]))
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - BOTTOM - TOP
    slot = plot_w / len(days)
    bars, labels = [], []
    every = max(1, -(-len(days) // 6))  # at most six date labels: readable on a phone
    for n, day in enumerate(days):
        cost = cost_by_day.get(day.isoformat(), 0)
        height = plot_h * cost / top
        x = LEFT + n * slot + slot * 0.15
        y = TOP + plot_h - height
        title = f"{day.isoformat()}: {format_amount(cost)} USD"
        bars.append(
            f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{slot * 0.7:.1f}"'
            f' height="{max(height, 0):.1f}"><title>{esc(title)}</title></rect>'
        )
        if n % every == 0:
            labels.append(
                f'<text x="{LEFT + n * slot + slot / 2:.1f}" y="{HEIGHT - 8}"'
                f' text-anchor="middle">{day.strftime("%d %b")}</text>'
            )
    axis = (
        f'<line class="axis" x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - 8}" y2="{TOP + plot_h}"/>'
        f'<line class="grid" x1="{LEFT}" y1="{TOP}" x2="{WIDTH - 8}" y2="{TOP}"/>'
        f'<text x="{WIDTH - 8}" y="{TOP - 6}" text-anchor="end">{format_amount(top)} USD</text>'
    )
    return (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img"'
        f' aria-label="Cost per day in USD">{axis}{"".join(bars)}{"".join(labels)}</svg>'
    )
