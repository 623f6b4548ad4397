"""A run's steps as a transcript, step by step: for a model step the messages it sent new
and the model's reply, for a sandbox step its code, stdout, stderr and "Exit code N";
each with its receipt's proof link. Every value escaped; long lines wrap (messages and
output) or scroll inside their block (code), never the page.

static/console.js draws the same markup for the steps that close while the page is open
(`transcriptItem`): a change here is a change there.
"""

from __future__ import annotations

from typing import Any

import orjson

from model_gateway.gateway.console.html import esc

ROLES = {"system": "Instructions", "user": "Input", "tool": "Tool result", "assistant": "Model"}
CUT_NOTE = '<p class="cut">Cut at 64 KiB.</p>'


def _pre(kind: str, text: str) -> str:
    return f'<pre class="{kind}">{esc(text)}</pre>'


def _part(label: str) -> str:
    return f'<p class="part">{esc(label)}</p>'


def _call(call: dict[str, Any]) -> str:
    """A tool call: run_code's program as code, anything else as its raw arguments."""
    arguments = call["arguments"]
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("code"), str):
        head = f"Calls <code>{esc(call['name'])}</code> ({esc(parsed.get('runtime'))})"
        body = _pre("code", parsed["code"])
    else:
        head, body = f"Calls <code>{esc(call['name'])}</code>", _pre("code", arguments)
    return f'<p class="call">{head}</p>{body}' + (CUT_NOTE if call.get("truncated") else "")


def _message(role: str, text: str, cut: bool, extra: str = "") -> str:
    return (
        f'<div class="msg {esc(role)}"><span class="who">{esc(ROLES.get(role, role))}</span>'
        + (_pre("text", text) if text else "")
        + (CUT_NOTE if cut else "")
        + extra
        + "</div>"
    )


def _model(transcript: dict[str, Any]) -> str:
    parts = [
        _message(m["role"], m["content"], bool(m.get("truncated"))) for m in transcript["messages"]
    ]
    reply = transcript.get("reply")
    if reply is not None:
        calls = "".join(_call(call) for call in reply["tool_calls"])
        parts.append(_message("assistant", reply["content"], bool(reply.get("truncated")), calls))
    return "".join(parts)


def _stream(transcript: dict[str, Any], name: str) -> str:
    cut = CUT_NOTE if transcript.get(f"{name}_truncated") else ""
    return _part(name) + _pre(f"stream {name}", transcript[name]) + cut


def _sandbox(transcript: dict[str, Any]) -> str:
    html = _part("Code") + _pre("code", transcript["code"])
    if transcript.get("code_truncated"):
        html += CUT_NOTE
    if "stdout" not in transcript:
        return html + '<p class="note">The program did not finish: no output.</p>'
    ok = transcript["exit_code"] == 0 and transcript["status"] == "completed"
    return (
        html
        + _stream(transcript, "stdout")
        + _stream(transcript, "stderr")
        + f'<p class="exit" data-ok="{str(ok).lower()}">Exit code {esc(transcript["exit_code"])}'
        f' <span class="note">· {esc(transcript["status"])}</span></p>'
    )


def step_item(position: int, step: dict[str, Any]) -> str:
    receipt = step["receipt_id"]
    link = (
        f'Receipt <a href="/proofs/{esc(receipt)}">{esc(receipt)}</a>' if receipt else "No receipt"
    )
    title = f"Step {position + 1} · {step['kind']} · {step.get('model') or step.get('runtime')}"
    transcript = step["transcript"]
    if transcript is None:
        body = '<p class="note">No transcript was kept for this step.</p>'
    elif step["kind"] == "model":
        body = _model(transcript)
    else:
        body = _sandbox(transcript)
    error = step["error"]
    if error:
        body += f'<p class="error-text">{esc(error.get("message", ""))}</p>'
    return (
        f'<li class="step" data-kind="{esc(step["kind"])}"><div class="step-head">'
        f'<span class="step-title">{esc(title)}</span><span class="step-receipt">{link}</span>'
        f"</div>{body}</li>"
    )


def transcript_list(steps: list[dict[str, Any]]) -> str:
    items = "".join(step_item(n, step) for n, step in enumerate(steps))
    return f'<ol id="run-transcript" class="transcript">{items}</ol>'
