"""The bench's Markdown report: header, results, gateway / bare ratios, memory, soak."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field

from load import WrkResult

MIB = 1024
BARE = "bare"
GOAL_RPS_RATIO = 0.70  # at 32 connections: gateway keeps >= 70 % of bare's req/s
GOAL_P50_DELTA_MS = 0.2  # sequentially: gateway adds <= 0.2 ms to bare's p50
GOAL_IDLE_MIB = 60


@dataclass
class Row:
    scenario: str
    connections: int
    target: str
    result: WrkResult | None = None
    cpu_ms: float = 0.0  # server CPU (user + system) per request
    peak_mib: float = 0.0  # highest server RSS sampled during the run
    other_cpu_pct: float = 0.0  # CPU used by processes outside the bench, % of one core
    problem: str = ""  # why there is no result


@dataclass
class Memory:
    target: str
    idle_mib: float  # after start-up, before any load
    after_mib: float = 0.0  # after all scenarios
    hwm_mib: float = 0.0  # VmHWM: the highest RSS the process ever had


@dataclass
class SoakMinute:
    minute: int
    rss_mib: float
    result: WrkResult | None = None


@dataclass
class Report:
    load: str
    rows: list[Row] = field(default_factory=list)
    memory: list[Memory] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    soak: list[SoakMinute] = field(default_factory=list)
    soak_title: str = ""


def machine() -> str:
    with open("/proc/cpuinfo") as cpuinfo:
        models = [
            line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")
        ]
    return (
        f"nproc {len(os.sched_getaffinity(0))}, CPU {models[0] if models else 'unknown'}, "
        f"Linux {platform.release()}, Python {platform.python_version()}"
    )


def table(header: list[str], rows: list[list[str]], left: tuple[int, ...] = (0,)) -> list[str]:
    """A Markdown table; the columns numbered in `left` are text, the others numbers."""
    align = ["---" if i in left else "---:" for i in range(len(header))]
    return ["| " + " | ".join(cells) + " |" for cells in [header, align, *rows]]


def result_cells(r: WrkResult) -> list[str]:
    return [f"{r.rps:,.0f}", f"{r.p50_ms:.3f}", f"{r.p90_ms:.3f}", f"{r.p99_ms:.3f}"]


def results_table(rows: list[Row]) -> list[str]:
    header = [
        "scenario",
        "conns",
        "target",
        "req/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "CPU ms/req",
        "peak RSS MiB",
        "errors",
        "other CPU %",
    ]
    cells = []
    for row in rows:
        start = [row.scenario, str(row.connections), row.target]
        if row.result is None:
            problem = " ".join(row.problem.replace("|", "/").split())
            cells.append([*start, f"failed: {problem}", *[""] * 7])
            continue
        errors = row.result.errors + row.result.bad_status
        cells.append(
            [
                *start,
                *result_cells(row.result),
                f"{row.cpu_ms:.3f}",
                f"{row.peak_mib:.1f}",
                f"{errors:,}",
                f"{row.other_cpu_pct:.0f}",
            ]
        )
    return table(header, cells, left=(0, 2))


def goal(gateway: WrkResult, bare: WrkResult, connections: int) -> str:
    """Sequential runs are judged on added p50, concurrent ones on kept throughput."""
    if connections == 1:
        met = gateway.p50_ms - bare.p50_ms <= GOAL_P50_DELTA_MS
        return f"p50 <= bare + {GOAL_P50_DELTA_MS} ms: {'met' if met else 'MISSED'}"
    met = gateway.rps / bare.rps >= GOAL_RPS_RATIO
    return f"req/s >= {GOAL_RPS_RATIO:.0%} of bare: {'met' if met else 'MISSED'}"


def ratios_table(rows: list[Row]) -> list[str]:
    bare_rows = {(r.scenario, r.connections): r for r in rows if r.target == BARE}
    cells = []
    for row in rows:
        bare = bare_rows.get((row.scenario, row.connections))
        if not row.target.startswith("gateway") or row.result is None:
            continue
        if bare is None or bare.result is None:
            continue
        b, g = bare.result, row.result
        cells.append(
            [
                row.scenario,
                str(row.connections),
                row.target,
                f"{g.rps / b.rps:.2f}",
                f"{g.p50_ms - b.p50_ms:+.3f}",
                f"{row.cpu_ms / bare.cpu_ms:.2f}",
                goal(g, b, row.connections),
            ]
        )
    if not cells:
        return ["No gateway results to compare with the bare pass-through."]
    header = [
        "scenario",
        "conns",
        "target",
        "req/s ÷ bare",
        "p50 - bare ms",
        "CPU/req ÷ bare",
        "goal",
    ]
    return table(header, cells, left=(0, 2, 6))


def memory_table(memory: list[Memory]) -> list[str]:
    cells = [
        [m.target, f"{m.idle_mib:.1f}", f"{m.after_mib:.1f}", f"{m.hwm_mib:.1f}"] for m in memory
    ]
    return table(["target", "idle RSS MiB (start)", "RSS MiB (end)", "VmHWM MiB"], cells)


def soak_table(soak: list[SoakMinute]) -> list[str]:
    cells = []
    for m in soak:
        load = (
            ["", "", "", "", ""]
            if m.result is None
            else [*result_cells(m.result), f"{m.result.errors + m.result.bad_status:,}"]
        )
        cells.append([str(m.minute), *load, f"{m.rss_mib:.1f}"])
    header = ["minute", "req/s", "p50 ms", "p90 ms", "p99 ms", "errors", "RSS MiB"]
    growth = soak[-1].rss_mib - soak[min(1, len(soak) - 1)].rss_mib
    return [*table(header, cells), "", f"RSS growth from minute 1 to the end: {growth:+.1f} MiB"]


def note_item(note: str) -> str:
    """A bullet; lines after the first (a log tail) go in a code block under it."""
    first, *rest = note.splitlines()
    if not rest:
        return f"- {first}"
    block = "\n".join("  " + line.strip() for line in rest)
    return f"- {first}\n\n  ```\n{block}\n  ```"


def render(report: Report) -> str:
    lines = [
        "# Gateway bench",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        f"- machine: {machine()}",
        f"- load: {report.load}",
        "",
    ]
    if report.rows:
        lines += [
            "## Results",
            "",
            *results_table(report.rows),
            "",
            "## Gateway / bare",
            "",
            *ratios_table(report.rows),
            "",
        ]
    if report.soak:
        lines += [f"## Soak: {report.soak_title}", "", *soak_table(report.soak), ""]
    if report.memory:
        lines += [
            "## Memory",
            "",
            *memory_table(report.memory),
            "",
            f"Goal: gateway idle RSS <= {GOAL_IDLE_MIB} MiB.",
            "",
        ]
    if report.notes:
        lines += ["## Notes", "", *map(note_item, report.notes), ""]
    return "\n".join(lines)
