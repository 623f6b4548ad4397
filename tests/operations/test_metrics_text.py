"""gateway/ops/metrics_text.py renders what prometheus_client would: checked by prometheus_client's
own parser, and byte for byte against its `generate_latest` (less its `_created` gauges)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import prometheus_client
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from model_gateway.gateway.ops.metrics import _BUCKETS, Metrics
from model_gateway.gateway.ops.metrics_text import (
    Counter,
    Gauge,
    Histogram,
    Registry,
    escape_label_value,
    format_value,
)
from model_gateway.pipeline.context import RequestContext
from model_gateway.pipeline.endpoint import Endpoint

TRICKY = ['say "hi"', "back\\slash", "new\nline", "ünïcødé ✓ 日本", "", "\\n literal", 'a\\"b']


def families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def without_created(text: str) -> str:
    """prometheus_client's exposition without its `<name>_created` gauge families."""
    kept = []
    for line in text.split("\n"):  # not splitlines: label values may hold \x1e, \x85, ...
        name = line.split(" ")[2] if line.startswith("#") else line.split("{")[0].split(" ")[0]
        if not name.endswith("_created"):
            kept.append(line)
    return "\n".join(kept)


def test_counters_parse_with_tricky_labels_and_zero_and_large_counts():
    registry = Registry()
    counter = Counter("demo_requests", "Requests by a \\ tricky\nhelp.", ["path", "code"])
    registry.register(counter)
    for i, value in enumerate(TRICKY):
        counter.labels(value, str(i)).inc(i)  # the first stays at zero
    counter.labels("big", "x").inc(2**60)
    counter.labels("big", "x").inc(1)
    counter.labels("frac", "x").inc(0.1)
    counter.labels("frac", "x").inc(0.2)

    parsed = families(registry.render().decode())
    family = parsed["demo_requests"]
    assert family.type == "counter"
    assert family.documentation == "Requests by a \\ tricky\nhelp."
    found = {(s.name, s.labels["path"], s.labels["code"]): s.value for s in family.samples}
    for i, value in enumerate(TRICKY):
        assert found[("demo_requests_total", value, str(i))] == i
    assert found[("demo_requests_total", "big", "x")] == float(2**60 + 1)
    assert found[("demo_requests_total", "frac", "x")] == 0.1 + 0.2
    assert len(found) == len(TRICKY) + 2


def test_children_are_kept_and_label_counts_checked():
    counter = Counter("c", "c", ["a", "b"])
    assert counter.labels("x", "y") is counter.labels("x", "y")
    assert counter.labels("x", 200) is counter.labels("x", "200")
    with pytest.raises(ValueError, match="expected labels"):
        counter.labels("x")
    with pytest.raises(ValueError, match="only go up"):
        counter.labels("x", "y").inc(-1)
    with pytest.raises(ValueError, match="sorted"):
        Histogram("h", "h", ["a"], [1, 0.5])


def test_histogram_buckets_are_cumulative_and_bounds_inclusive():
    registry = Registry()
    histogram = Histogram("demo_seconds", "Time.", ["endpoint"], _BUCKETS)
    registry.register(histogram)
    on_bounds = histogram.labels('a "quoted"\npath\\')
    for bound in _BUCKETS:  # exactly on each bound: counted in that bound's bucket
        on_bounds.observe(bound)
    on_bounds.observe(121)  # past the last bound: +Inf only
    on_bounds.observe(0)
    histogram.labels("idle")  # a child never observed: all zero

    family = families(registry.render().decode())["demo_seconds"]
    assert family.type == "histogram"
    by_endpoint: dict[str, dict[str, float]] = {}
    for sample in family.samples:
        labels = dict(sample.labels)
        endpoint = labels.pop("endpoint")
        key = sample.name + (f"[{labels['le']}]" if "le" in labels else "")
        by_endpoint.setdefault(endpoint, {})[key] = sample.value

    busy = by_endpoint['a "quoted"\npath\\']
    for i, bound in enumerate(_BUCKETS):
        assert busy[f"demo_seconds_bucket[{format_value(bound)}]"] == i + 2  # 0 and each bound
    assert busy["demo_seconds_bucket[+Inf]"] == len(_BUCKETS) + 2
    assert busy["demo_seconds_count"] == len(_BUCKETS) + 2
    assert busy["demo_seconds_sum"] == pytest.approx(sum(_BUCKETS) + 121)
    idle = by_endpoint["idle"]
    assert set(idle.values()) == {0.0}
    assert len(idle) == len(_BUCKETS) + 3  # the buckets, +Inf, _count, _sum


def test_scrape_time_gauges():
    registry = Registry()
    reads = iter([1.5, 2.5])
    registry.register(Gauge.single("demo_level", "Level.", lambda: next(reads)))
    registry.register(
        Gauge("demo_node_up", "Up.", lambda: [(("n\n0",), 1), (("n1",), 0)], ["node"])
    )
    text = registry.render().decode()
    assert "demo_level 1.5\n" in text
    assert 'demo_node_up{node="n\\n0"} 1.0\n' in text
    parsed = families(text)
    assert parsed["demo_node_up"].type == "gauge"
    assert [(s.labels, s.value) for s in parsed["demo_node_up"].samples] == [
        ({"node": "n\n0"}, 1.0),
        ({"node": "n1"}, 0.0),
    ]
    assert "demo_level 2.5\n" in registry.render().decode()  # read at each scrape


@pytest.mark.parametrize(
    "value",
    [0, 1, 0.0005, 1e-9, 120, 999999.0, 1e6, 1e7, 1234567.0, 12345678.9, 2**53, 1e16, 1e300,
     -1e7, -0.5, math.inf, -math.inf, math.nan],
)  # fmt: skip
def test_values_are_formatted_as_prometheus_client_formats_them(value):
    from prometheus_client.utils import floatToGoString

    assert format_value(value) == floatToGoString(value)


def test_escaping_matches_prometheus_client():
    from prometheus_client.openmetrics.exposition import ALLOWUTF8, _escape

    for value in TRICKY:
        assert escape_label_value(value) == _escape(value, ALLOWUTF8, False)


def _gateway_metrics_against_prometheus_client(labels, observations, increments):
    """The same updates through ours and prometheus_client's: the same exposition."""
    ours = Registry()
    theirs = prometheus_client.CollectorRegistry()
    counter = Counter("t_events", "Events.", ["kind", "where"])
    histogram = Histogram("t_seconds", "Time.", ["where"], _BUCKETS)
    ours.register(counter)
    ours.register(histogram)
    their_counter = prometheus_client.Counter(
        "t_events", "Events.", ["kind", "where"], registry=theirs
    )
    their_histogram = prometheus_client.Histogram(
        "t_seconds", "Time.", ["where"], buckets=_BUCKETS, registry=theirs
    )
    for i, (label, seconds, amount) in enumerate(
        zip(labels, observations, increments, strict=False)
    ):
        kind = labels[(i * 7) % len(labels)]
        counter.labels(kind, label).inc(amount)
        their_counter.labels(kind, label).inc(amount)
        histogram.labels(label).observe(seconds)
        their_histogram.labels(label).observe(seconds)
    return ours.render(), without_created(prometheus_client.generate_latest(theirs).decode())


LABEL = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)  # no lone surrogates
SECONDS = st.one_of(
    st.sampled_from(_BUCKETS),  # on a bound
    st.floats(min_value=-1, max_value=1e6, allow_nan=False),
    st.sampled_from([0.0, math.inf, 121.0, 1e-12]),
)
AMOUNT = st.one_of(st.integers(0, 2**63), st.floats(0, 1e18, allow_nan=False))


@settings(max_examples=150, deadline=None)
@given(
    labels=st.lists(LABEL, min_size=1, max_size=8),
    observations=st.lists(SECONDS, min_size=1, max_size=30),
    increments=st.lists(AMOUNT, min_size=1, max_size=30),
)
def test_exposition_is_byte_for_byte_prometheus_clients(labels, observations, increments):
    labels = labels * 4  # some label tuples repeat
    ours, theirs = _gateway_metrics_against_prometheus_client(labels, observations, increments)
    assert ours.decode() == theirs


@settings(max_examples=100, deadline=None)
@given(
    labels=st.lists(LABEL, min_size=1, max_size=6, unique=True),
    observations=st.lists(SECONDS, min_size=1, max_size=20),
)
def test_parser_reads_back_labels_and_cumulative_buckets(labels, observations):
    registry = Registry()
    histogram = Histogram("p_seconds", "Time.", ["where"], _BUCKETS)
    registry.register(histogram)
    expected: dict[str, list[float]] = {}
    for i, seconds in enumerate(observations):
        label = labels[i % len(labels)]
        histogram.labels(label).observe(seconds)
        expected.setdefault(label, []).append(seconds)

    family = families(registry.render().decode())["p_seconds"]
    buckets: dict[str, dict[float, float]] = {}
    counts: dict[str, float] = {}
    for sample in family.samples:
        where = sample.labels["where"]
        if sample.name == "p_seconds_bucket":
            buckets.setdefault(where, {})[float(sample.labels["le"])] = sample.value
        elif sample.name == "p_seconds_count":
            counts[where] = sample.value
    assert set(buckets) == set(expected)
    for where, seen in expected.items():
        assert counts[where] == len(seen)
        for bound, cumulative in buckets[where].items():
            assert cumulative == sum(1 for s in seen if s <= bound)


async def _never_called(ctx: RequestContext) -> None:
    raise AssertionError("no request is served here")


def test_gateway_metrics_render_the_names_dashboards_use():
    metrics = Metrics()
    metrics.gauge("gateway_open_holds", "Holds of this process not yet closed.", lambda: 0)
    pool = SimpleNamespace(
        nodes=[SimpleNamespace(name="sandbox_nodes[0]", healthy=True, max_concurrent=4, in_use=1)]
    )
    metrics.sandbox_nodes(pool)
    ctx = RequestContext("req_1")
    metrics.request_done(ctx, "GET", "/nope", 404, 0.001)
    metrics.request_done(ctx, "GET", "/nope", 404, 0.002)
    chat = Endpoint("POST", "/v1/chat/completions", "inference", _never_called)
    refused = RequestContext("req_2", endpoint=chat, rate_limited="tpm")
    metrics.request_done(refused, "POST", "/v1/chat/completions", 429, 0.001)
    text = metrics.text().decode()
    assert 'gateway_rate_limited_total{reason="tpm"} 1.0\n' in text
    assert "# TYPE gateway_requests_total counter\n" in text
    assert 'gateway_requests_total{endpoint="unmatched",method="GET",status="404"} 2.0\n' in text
    assert 'gateway_request_duration_seconds_bucket{endpoint="unmatched",le="0.0025"} 2.0' in text
    assert 'gateway_sandbox_node_slots_in_use{node="sandbox_nodes[0]"} 1.0\n' in text
    assert "gateway_open_holds 0.0\n" in text
    assert set(families(text)) >= {
        "gateway_requests",
        "gateway_request_duration_seconds",
        "gateway_overhead_seconds",
        "gateway_upstream_attempts",
        "gateway_upstream_failures",
        "gateway_reservations_refused",
        "gateway_rate_limited",
        "gateway_spend_micro_units",
        "gateway_sandbox_executions",
        "gateway_open_holds",
        "gateway_sandbox_node_up",
        "gateway_sandbox_node_slots",
        "gateway_sandbox_node_slots_in_use",
    }
