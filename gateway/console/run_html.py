"""One run as HTML: status, `spent` against `budget` as a bar (SVG attributes, no inline
style), its steps with their receipts' proof links, each step's transcript
(transcript_html), output or error, and a cancel button.

The page is complete as served; while the run goes on, static/console.js reads the run's
events (`data-events`) and redraws the same elements by their ids.
"""

from __future__ import annotations

from typing import Any

from model_gateway.gateway.console.html import esc, usd_text
from model_gateway.gateway.console.transcript_html import transcript_list
from model_gateway.gateway.metering.money import parse_amount

BAR_WIDTH = 1000  # the bar's SVG user units; console.js scales to the same width
STEP_COLUMNS = [
    "#",
    "Kind",
    "Model / runtime",
    "Tokens in",
    "Tokens out",
    "Duration",
    "Cost",
    "Receipt",
    "Error",
]


def spent_width(spent: str, budget: str) -> int:
    """The spent part of the bar, in BAR_WIDTH units (exact integers, capped)."""
    total = parse_amount(budget, at_most=None)
    if total <= 0:
        return 0
    return min(BAR_WIDTH, parse_amount(spent, at_most=None) * BAR_WIDTH // total)


def _step_row(position: int, step: dict[str, Any]) -> str:
    receipt = step["receipt_id"]
    link = f'<a href="/proofs/{esc(receipt)}">{esc(receipt)}</a>' if receipt else "none"
    error = step["error"] or {}
    cells = [
        esc(position + 1),
        esc(step["kind"]),
        esc(step.get("model") or step.get("runtime")),
        esc(step["input_tokens"]),
        esc(step["output_tokens"]),
        f"{esc(step['duration_ms'])} ms",
        f'<span class="num">{esc(usd_text(step["cost"]))}</span>',
        link,
        esc(error.get("message", "")),
    ]
    return (
        "<tr>"
        + "".join(
            f'<td data-label="{esc(h)}">{c}</td>' for h, c in zip(STEP_COLUMNS, cells, strict=True)
        )
        + "</tr>"
    )


def budget_bar(spent: str, budget: str) -> str:
    width = spent_width(spent, budget)
    return (
        f'<svg class="budget-bar" viewBox="0 0 {BAR_WIDTH} 14" preserveAspectRatio="none"'
        ' role="img" aria-label="spent against budget">'
        f'<rect class="track" width="{BAR_WIDTH}" height="14"></rect>'
        f'<rect class="spent" id="run-bar" width="{width}" height="14"></rect></svg>'
        f'<p class="budget-text"><span class="num" id="run-spent">{esc(usd_text(spent))}</span>'
        f' of <span class="num" id="run-budget">{esc(usd_text(budget))}</span> spent</p>'
    )


def run_body(agent_id: str, run: dict[str, Any]) -> str:
    base = f"/console/api/agents/{esc(agent_id)}/runs/{esc(run['id'])}"
    running = run["status"] == "running"
    cancel = (
        f'<button type="button" class="danger" id="run-cancel" data-post="{base}/cancel"'
        ' data-confirm="Cancel this run? The step in flight stops and is billed for what ran.">'
        "Cancel run</button>"
        if running
        else ""
    )
    head = "".join(f"<th>{esc(h)}</th>" for h in STEP_COLUMNS)
    rows = "".join(_step_row(n, step) for n, step in enumerate(run["steps"]))
    error = run["error"] or {}
    error_text = f"{error['type']}: {error['message']}" if error else ""
    return (
        f'<section id="run" class="run" data-api="{base}" data-running="{str(running).lower()}">'
        f'<h2>Run <code>{esc(run["id"])}</code> <span id="run-status" class="status"'
        f' data-status="{esc(run["status"])}">{esc(run["status"])}</span></h2>'
        f'<div class="card budget">{budget_bar(run["spent"], run["budget"])}{cancel}</div>'
        f'<h3>Input</h3><pre class="output input">{esc(run["input"])}</pre>'
        '<h3>Steps</h3><p id="run-live" class="note" aria-live="polite"></p>'
        f'<div class="scroll"><table id="run-steps"><thead><tr>{head}</tr></thead>'
        f"<tbody>{rows}</tbody></table></div>"
        f"<h3>Transcript</h3>{transcript_list(run['steps'])}"
        f'<h3>Output</h3><pre id="run-output" class="output">{esc(run["output"] or "")}</pre>'
        f'<p id="run-error" class="error-text" role="alert">{esc(error_text)}</p>'
        "</section>"
    )
