"""Prometheus metrics: one registry per gateway, served as text at GET /metrics.

Label values are bounded sets: route templates (never raw paths), provider and model ids
from the config, error reasons and statuses from fixed lists. Gauges that are cheap to
read (open holds, log size and lag) are read at scrape time, not kept on the hot path.
"""

from __future__ import annotations

import operator
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from model_gateway.gateway.ops.metrics_text import (
    Counter,
    CounterChild,
    Family,
    Gauge,
    GaugeCombine,
    Histogram,
    HistogramChild,
    PeerSamples,
    Registry,
)
from model_gateway.gateway.routing.breaker import GAUGE_VALUE, Breakers
from model_gateway.pipeline.context import RequestContext, Settlement

if TYPE_CHECKING:
    from model_gateway.gateway.sandbox.pool import NodePool, SandboxNode

# A node gauge's samples: ((node name,), value) per node.
_NodeSamples = list[tuple[tuple[str], float]]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNMATCHED = "unmatched"  # the endpoint label of a request no route matched
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)


class _ScrapeTimeGauges:
    """The unlabelled gauges of `Metrics.gauge`, in one place of the exposition."""

    def __init__(self) -> None:
        self.gauges: dict[str, Gauge] = {}

    def families(self) -> Iterable[Family]:
        return self.gauges.values()


_BREAKER_SEVERITY = {0.0: 0, 2.0: 1, 1.0: 2}  # closed, half-open, open (GAUGE_VALUE)


def _worst_breaker(mine: float, theirs: float) -> float:
    """Breakers are per worker (each judges the calls it made): the server's is the worst
    of them, open before half-open before closed."""
    return max(mine, theirs, key=lambda value: _BREAKER_SEVERITY.get(value, 0))


def _node_up(nodes: Sequence[SandboxNode]) -> _NodeSamples:
    return [((node.name,), int(node.healthy)) for node in nodes]


def _node_slots(nodes: Sequence[SandboxNode]) -> _NodeSamples:
    return [((node.name,), node.max_concurrent) for node in nodes]


def _node_in_use(nodes: Sequence[SandboxNode]) -> _NodeSamples:
    return [((node.name,), node.in_use) for node in nodes]


def _pool_reader(
    pool: NodePool, read: Callable[[Sequence[SandboxNode]], _NodeSamples]
) -> Callable[[], _NodeSamples]:
    """`read` over the pool's nodes as they are at scrape time."""
    return lambda: read(pool.nodes)


class Metrics:
    """The gateway's metric families, and the `RequestObserver` that feeds the per-request ones."""

    def __init__(self) -> None:
        self.registry = r = Registry()
        self.requests = Counter(
            "gateway_requests", "Requests by endpoint and status.", ["endpoint", "method", "status"]
        )
        self.latency = Histogram(
            "gateway_request_duration_seconds", "Whole request time.", ["endpoint"], _BUCKETS
        )
        self.overhead = Histogram(
            "gateway_overhead_seconds",
            "Request time not spent waiting on the upstream or the sandbox node.",
            ["endpoint"],
            _BUCKETS,
        )
        self.upstream_attempts = Counter(
            "gateway_upstream_attempts", "Calls to upstream providers.", ["provider"]
        )
        self.upstream_failures = Counter(
            "gateway_upstream_failures", "Failed upstream calls by reason.", ["provider", "reason"]
        )
        self.refused = Counter(
            "gateway_reservations_refused", "Reservations refused, by reason.", ["reason"]
        )
        self.rate_limited = Counter(
            "gateway_rate_limited",
            "Requests refused 429 by a rate limit, by reason: rpm or tpm.",
            ["reason"],
        )
        self.spend = Counter(
            "gateway_spend_micro_units",
            "Charged micro-units (1e-6 USD) by model or runtime.",
            ["subject"],
        )
        self.sandbox_executions = Counter(
            "gateway_sandbox_executions", "Sandbox executions by status.", ["status"]
        )
        for family in (
            self.requests,
            self.latency,
            self.overhead,
            self.upstream_attempts,
            self.upstream_failures,
            self.refused,
            self.rate_limited,
            self.spend,
            self.sandbox_executions,
        ):
            r.register(family)
        self._gauges = _ScrapeTimeGauges()
        r.register(self._gauges)
        # With workers: the other processes' samples, asked for at each scrape.
        self.peers: Callable[[], Awaitable[list[PeerSamples]]] | None = None
        # Per (endpoint, method, status): bounded by the route table and the statuses.
        self._series: dict[
            tuple[str, str, int], tuple[CounterChild, HistogramChild, HistogramChild]
        ] = {}

    def gauge(
        self,
        name: str,
        documentation: str,
        read: Callable[[], float],
        combine: GaugeCombine = operator.add,
    ) -> None:
        """A gauge read at scrape time (e.g. open holds, the log's size); `combine`: how
        several workers' values make the server's."""
        self._gauges.gauges[name] = Gauge.single(name, documentation, read, combine)

    def breakers(self, breakers: Breakers) -> None:
        """Publish the providers' breakers (gateway.routing.breaker.Breakers):
        gateway_provider_breaker{provider}: 0 closed, 1 open, 2 half-open (read at scrape)."""
        self.registry.register(
            Gauge(
                "gateway_provider_breaker",
                "Circuit breaker per provider: 0 closed, 1 open, 2 half-open.",
                lambda: [((p,), GAUGE_VALUE[s]) for p, s in breakers.states().items()],
                ["provider"],
                combine=_worst_breaker,
            )
        )

    def sandbox_nodes(self, pool: NodePool) -> None:
        """Publish the sandbox nodes' health and slots (gateway.sandbox.pool.NodePool): per
        node (its config name), up (1/0), slots, slots in use (read at scrape)."""
        for name, documentation, read, combine in (
            ("gateway_sandbox_node_up", "Sandbox node healthy (1) or skipped (0).", _node_up, min),
            (
                "gateway_sandbox_node_slots",
                "Sandbox node slots (max_concurrent).",
                _node_slots,
                max,
            ),
            (
                "gateway_sandbox_node_slots_in_use",
                "Sandbox node slots running.",
                _node_in_use,
                operator.add,  # each worker counts the runs it sent
            ),
        ):
            reader = _pool_reader(pool, read)
            self.registry.register(Gauge(name, documentation, reader, ["node"], combine))

    def text(self) -> bytes:
        return self.registry.render()

    async def server_text(self) -> bytes:
        """The exposition for the whole server: with workers, every worker's samples
        (gathered by `peers`, gateway/ops/worker_metrics.py) combined with this one's."""
        if self.peers is None:
            return self.text()
        return self.registry.render(await self.peers())

    # RequestObserver
    def request_done(
        self, ctx: RequestContext, method: str, path: str, status: int, seconds: float
    ) -> None:
        endpoint = ctx.endpoint.path if ctx.endpoint is not None else UNMATCHED
        series = self._series.get((endpoint, method, status))
        if series is None:  # resolve the children once per label tuple
            series = self._series[(endpoint, method, status)] = (
                self.requests.labels(endpoint, method, str(status)),
                self.latency.labels(endpoint),
                self.overhead.labels(endpoint),
            )
        requests, latency, overhead = series
        requests.value += 1  # CounterChild.inc without the call
        latency.observe(seconds)
        overhead.observe(max(0.0, seconds - ctx.upstream_seconds))
        if ctx.rate_limited is not None:
            self.rate_limited.labels(ctx.rate_limited).inc()
        if ctx.endpoint is not None and ctx.endpoint.path == "/v1/sandbox/executions":
            if ctx.billing is not None:
                self.sandbox_executions.labels(ctx.billing.outcome).inc()

    # Meter hooks
    def reservation_refused(self, reason: str) -> None:
        self.refused.labels(reason).inc()

    def charged(self, settlement: Settlement) -> None:
        self.spend.labels(settlement.subject).inc(settlement.cost)
