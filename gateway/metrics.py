"""Prometheus metrics: one registry per gateway, served as text at GET /metrics.

Label values are bounded sets: route templates (never raw paths), provider and model ids
from the config, error reasons and statuses from fixed lists. Gauges that are cheap to
read (open holds, log size and lag) are read at scrape time, not kept on the hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from model_gateway.gateway.routing.breaker import GAUGE_VALUE
from model_gateway.pipeline.context import RequestContext, Settlement

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNMATCHED = "unmatched"  # the endpoint label of a request no route matched
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)


class _ScrapeTimeGauges(Collector):
    def __init__(self, gauges: dict[str, tuple[str, Callable[[], float]]]) -> None:
        self.gauges = gauges

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, (documentation, read) in self.gauges.items():
            yield GaugeMetricFamily(name, documentation, value=read())


class _BreakerGauge(Collector):
    """gateway_provider_breaker{provider}: 0 closed, 1 open, 2 half-open (read at scrape)."""

    def __init__(self, breakers) -> None:
        self.breakers = breakers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "gateway_provider_breaker",
            "Circuit breaker per provider: 0 closed, 1 open, 2 half-open.",
            labels=["provider"],
        )
        for provider, state in self.breakers.states().items():
            family.add_metric([provider], GAUGE_VALUE[state])
        yield family


class _SandboxNodeGauges(Collector):
    """Per sandbox node (its config name): up (1/0), slots, slots in use (read at scrape)."""

    def __init__(self, pool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {
            "up": GaugeMetricFamily(
                "gateway_sandbox_node_up",
                "Sandbox node healthy (1) or skipped (0).",
                labels=["node"],
            ),
            "slots": GaugeMetricFamily(
                "gateway_sandbox_node_slots",
                "Sandbox node slots (max_concurrent).",
                labels=["node"],
            ),
            "in_use": GaugeMetricFamily(
                "gateway_sandbox_node_slots_in_use", "Sandbox node slots running.", labels=["node"]
            ),
        }
        for node in self.pool.nodes:
            families["up"].add_metric([node.name], int(node.healthy))
            families["slots"].add_metric([node.name], node.max_concurrent)
            families["in_use"].add_metric([node.name], node.in_use)
        yield from families.values()


class Metrics:
    """The gateway's metric families, and the `RequestObserver` that feeds the per-request ones."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "gateway_requests",
            "Requests by endpoint and status.",
            ["endpoint", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "gateway_request_duration_seconds",
            "Whole request time.",
            ["endpoint"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "gateway_overhead_seconds",
            "Request time not spent waiting on the upstream or the sandbox node.",
            ["endpoint"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.upstream_attempts = Counter(
            "gateway_upstream_attempts", "Calls to upstream providers.", ["provider"], registry=r
        )
        self.upstream_failures = Counter(
            "gateway_upstream_failures",
            "Failed upstream calls by reason.",
            ["provider", "reason"],
            registry=r,
        )
        self.refused = Counter(
            "gateway_reservations_refused",
            "Reservations refused, by reason.",
            ["reason"],
            registry=r,
        )
        self.spend = Counter(
            "gateway_spend_micro_units",
            "Charged micro-units (1e-6 USD) by model or runtime.",
            ["subject"],
            registry=r,
        )
        self.sandbox_executions = Counter(
            "gateway_sandbox_executions", "Sandbox executions by status.", ["status"], registry=r
        )
        self._gauges: dict[str, tuple[str, Callable[[], float]]] = {}
        # Per (endpoint, method, status): bounded by the route table and the statuses.
        self._series: dict[tuple[str, str, int], tuple[Counter, Histogram, Histogram]] = {}
        r.register(_ScrapeTimeGauges(self._gauges))

    def gauge(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        """A gauge read at scrape time (e.g. open holds, the log's size)."""
        self._gauges[name] = (documentation, read)

    def breakers(self, breakers) -> None:
        """Publish the providers' breakers (gateway.routing.breaker.Breakers)."""
        self.registry.register(_BreakerGauge(breakers))

    def sandbox_nodes(self, pool) -> None:
        """Publish the sandbox nodes' health and slots (gateway.sandbox.pool.NodePool)."""
        self.registry.register(_SandboxNodeGauges(pool))

    def text(self) -> bytes:
        return generate_latest(self.registry)

    # RequestObserver
    def request_done(
        self, ctx: RequestContext, method: str, path: str, status: int, seconds: float
    ) -> None:
        endpoint = ctx.endpoint.path if ctx.endpoint is not None else UNMATCHED
        series = self._series.get((endpoint, method, status))
        if series is None:  # labels() costs more than the update: resolve it once
            series = self._series[(endpoint, method, status)] = (
                self.requests.labels(endpoint, method, str(status)),
                self.latency.labels(endpoint),
                self.overhead.labels(endpoint),
            )
        requests, latency, overhead = series
        requests.inc()
        latency.observe(seconds)
        overhead.observe(max(0.0, seconds - ctx.upstream_seconds))
        if ctx.endpoint is not None and ctx.endpoint.path == "/v1/sandbox/executions":
            if ctx.billing is not None:
                self.sandbox_executions.labels(ctx.billing.outcome).inc()

    # Meter hooks
    def reservation_refused(self, reason: str) -> None:
        self.refused.labels(reason).inc()

    def charged(self, settlement: Settlement) -> None:
        self.spend.labels(settlement.subject).inc(settlement.cost)
