"""SandboxPricing alone: a fee plus wall time, rounded up, never beyond the timeout."""

from __future__ import annotations

from types import SimpleNamespace

from model_gateway.gateway.metering.pricing import SandboxPricing
from model_gateway.pipeline.context import Billing, RequestContext
from model_gateway.storage import SandboxRecord

PRICING = SandboxPricing(per_execution=100, per_second=333)


def ctx(timeout_s: int | None, duration_ms: int = 0):
    sandbox = None
    if timeout_s is not None:
        sandbox = SandboxRecord(
            id="sbx_1", project_id="prj_1", runtime="python", timeout_s=timeout_s, memory_mb=256
        )
    context = RequestContext("req_test", payload=SimpleNamespace(runtime="python", sandbox=sandbox))
    context.billing = Billing("succeeded", {"duration_ms": duration_ms})
    return context


def test_hold_covers_the_whole_timeout():
    assert PRICING.estimate(ctx(30)) == 100 + 333 * 30


def test_cost_rounds_up_to_the_micro_unit():
    assert PRICING.cost(ctx(30, 0)) == 100
    assert PRICING.cost(ctx(30, 1)) == 101  # 0.333 -> 1
    assert PRICING.cost(ctx(30, 1000)) == 433


def test_time_beyond_the_timeout_is_not_billed():
    assert PRICING.cost(ctx(2, 2150)) == PRICING.estimate(ctx(2))


def test_subject_is_the_runtime():
    assert (PRICING.kind, PRICING.subject(ctx(1))) == ("sandbox", "python")
