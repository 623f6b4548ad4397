"""The app factory: `create_app(config)` returns the gateway as one ASGI app."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from model_gateway.gateway.access.keyring import KeyRing
from model_gateway.gateway.agents.run_engine import AgentEngine
from model_gateway.gateway.api import CoreHandlers
from model_gateway.gateway.catalog import ConfigCatalog
from model_gateway.gateway.cluster.instance import Instance
from model_gateway.gateway.config import Config
from model_gateway.gateway.console.mount import mount_console
from model_gateway.gateway.inference.embeddings import EmbeddingsHandlers
from model_gateway.gateway.inference.handlers import InferenceHandlers
from model_gateway.gateway.metering.leased_meter import LeasedMeter
from model_gateway.gateway.metering.storage_meter import StorageMeter, process_owner
from model_gateway.gateway.ops.logs import AccessLog
from model_gateway.gateway.ops.metrics import Metrics
from model_gateway.gateway.ops.secretfile import load_or_create_secret
from model_gateway.gateway.ops.summary import startup_summary
from model_gateway.gateway.ops.worker_seat import WorkerSeat
from model_gateway.gateway.proofs.endpoints import ProofHandlers, log_origin
from model_gateway.gateway.proofs.log import TransparencyLog
from model_gateway.gateway.proofs.log_key import SigningKey, load_or_create_signing_key
from model_gateway.gateway.proofs.log_process import LogProcess
from model_gateway.gateway.providers import Providers
from model_gateway.gateway.ratelimit.limiters import Limiter, open_limiter
from model_gateway.gateway.sandbox.executions import SandboxExecutions
from model_gateway.gateway.sandbox.pool import NodePool
from model_gateway.pipeline import build_pipeline
from model_gateway.pipeline.endpoint import RouteTable
from model_gateway.pipeline.ports import Meter, RequestObserver
from model_gateway.storage import ReceiptRecord, Storage, open_storage

if TYPE_CHECKING:
    from model_gateway.gateway.telemetry.tracing import Tracing

log = logging.getLogger("gateway")


@dataclass(eq=False)
class Gateway:
    """The composition root: every part a request may need, each built and started before
    the gateway is (`open_gateway`), so none is missing; `close` stops them in reverse."""

    config: Config
    catalog: ConfigCatalog
    metrics: Metrics
    access_log: AccessLog | None  # None: [server] access_log = false
    storage: Storage
    instance: Instance
    keyring: KeyRing
    limiter: Limiter
    meter: StorageMeter
    signing_key: SigningKey
    transparency_log: TransparencyLog
    log_process: LogProcess | None  # the log integrated by a child ([proofs] log_process)
    log_status: _LogStatus
    providers: Providers
    sandboxes: SandboxExecutions
    routes: RouteTable
    agents: AgentEngine
    _closing: contextlib.AsyncExitStack
    tracing: Tracing | None = None  # [telemetry] otlp_endpoint set: traces (gateway/telemetry)

    async def close(self) -> None:
        await self._closing.aclose()

    def register_gauges(self) -> None:
        meter, proofs, status = self.meter, self.transparency_log, self.log_status
        self.metrics.gauge(
            "gateway_open_holds", "Holds of this process not yet closed.", lambda: meter.open_holds
        )  # (with workers, these gauges combine as gateway/ops/metrics_text.py says)
        self.metrics.breakers(self.providers.breakers)
        self.metrics.sandbox_nodes(self.sandboxes.pool)
        self.metrics.gauge(
            "gateway_log_size", "Receipts in the signed log.", lambda: status.log_size, max
        )
        self.metrics.gauge(
            "gateway_log_integration_lag_seconds",
            "Seconds the oldest receipt not yet logged has waited, as of the log's last look.",
            lambda: proofs.integration_lag_s,
            min,  # the freshest look of any worker
        )
        self.metrics.gauge(
            "gateway_log_sequencer",
            "1 on the one instance that integrates and signs the log, 0 on the others.",
            lambda: float(status.log_sequencer),
            max,
        )
        self.metrics.gauge(
            "gateway_log_read_back",
            "Receipts the log read back whole from storage since start: settled by another"
            " instance or before a restart, or not handed over from memory.",
            lambda: status.log_read_back,
        )

    def observers(self) -> list[RequestObserver]:
        """Who hears how each request went (the /v1 chain's Observe stage, the console's):
        the metrics and the access log, as configured."""
        return [
            *([self.metrics] if self.config.metrics.enabled else []),
            *([self.access_log] if self.access_log is not None else []),
        ]

    def pipeline(self, authenticate: Middleware | None = None) -> ASGIApp:
        """The request path over this gateway's parts; `authenticate` swaps key auth for
        another principal (the console playground)."""
        config, tracing = self.config, self.tracing
        meter: Meter | None = self.meter if config.metering.enabled else None
        if tracing is not None and meter is not None:
            meter = tracing.meter(meter)  # a span for each settlement
        path = build_pipeline(
            routes=self.routes,
            keys=self.keyring,
            catalog=self.catalog,
            limiter=self.limiter,
            meter=meter,
            cors_origins=config.server.cors_origins,
            default_key_rpm=config.limits.default_key_rpm,
            default_project_rpm=config.limits.default_project_rpm,
            observers=self.observers(),
            authenticate=authenticate,
        )
        return path if tracing is None else tracing.layer(path)  # off: not in the chain


async def open_gateway(
    config: Config,
    log_process: bool = False,
    nodes: NodePool | None = None,
    seat: WorkerSeat | None = None,
) -> Gateway:
    """Build and start every part, in order; a part that fails stops those before it.
    `log_process` (gateway serve): the transparency log in a child process when the config
    says so (gateway/proofs/log_process.py). `nodes`: the sandbox nodes, when made before
    (a spawned node's port is bound then: taken, `gateway serve` stops before serving).
    `seat`: this process is one worker of `gateway serve --workers N` (gateway/ops/workers.py)."""
    async with contextlib.AsyncExitStack() as stack:
        nodes = nodes or NodePool(config)
        stack.push_async_callback(nodes.close)  # its node's port, bound: freed on any failure
        tracing = None
        if config.telemetry.otlp_endpoint:
            # OpenTelemetry is imported only now: neither the CLI nor an untraced gateway pays.
            from model_gateway.gateway.telemetry.tracing import Tracing

            tracing = Tracing(config.telemetry.otlp_endpoint)
            stack.push_async_callback(tracing.shutdown)  # after every request: exports all spans
        metrics = Metrics()
        if seat is not None:
            stack.push_async_callback(await seat.share_metrics(metrics))
        access_log = AccessLog(config.server.log_format) if config.server.access_log else None
        if access_log is not None:
            stack.callback(access_log.close)
        pepper = load_or_create_secret(config.path(config.secrets.key_pepper_file))
        storage = await open_storage(config.storage_url)
        stack.push_async_callback(storage.close)
        owner, lease_s = process_owner(), config.cluster.lease_s
        instance = Instance(storage, owner, lease_s)
        await instance.start()  # registered and leased before anything is served
        stack.push_async_callback(instance.stop)  # deregisters: nothing waits for it any more
        keyring = KeyRing(storage, pepper, instance)
        signing_key = load_or_create_signing_key(config.path(config.secrets.signing_key_file))
        transparency_log = TransparencyLog(storage, signing_key, origin=log_origin(config))
        child = None
        if log_process and config.proofs.log_process:
            child = LogProcess(
                config.storage_url,
                config.path(config.secrets.signing_key_file),
                log_origin(config),
                config.server.log_format,
            )
            await child.start()  # first: it takes the sequencer lock
            stack.push_async_callback(child.stop)  # after the last settlement: logs them all
        await transparency_log.start()  # integrates, or follows the log process
        stack.push_async_callback(transparency_log.stop)
        log_status = _LogStatus(transparency_log, child)
        limiter = await open_limiter(config, storage, seat)
        stack.push_async_callback(limiter.close)

        def offer_to_the_log(record: ReceiptRecord) -> None:
            """A receipt being settled, to whichever log integrates here."""
            transparency_log.offer(record)
            if child is not None:
                child.offer(record)

        meter_class = LeasedMeter if config.metering.leases else StorageMeter
        meter = meter_class(
            storage,
            metrics,
            owner=owner,
            lease_s=lease_s,
            instance=instance,
            on_settling=offer_to_the_log,
        )
        await meter.start()
        stack.push_async_callback(meter.stop)  # before the logs stop: they log every receipt
        providers = Providers(config)
        await providers.start()
        stack.push_async_callback(providers.close)
        sandboxes = SandboxExecutions(config, storage, nodes)
        await sandboxes.start()  # node sessions, health checks; spawn = true: the node
        stack.push_async_callback(sandboxes.close)
        core = CoreHandlers(
            config=config,
            catalog=ConfigCatalog(config),
            storage=storage,
            instance=instance,
            breakers=providers.breakers,
            nodes=sandboxes.pool,
            log=log_status,
            metrics=metrics,
        )
        inference = InferenceHandlers(providers, config.limits.gateway_timeout_s, metrics)
        embeddings = EmbeddingsHandlers(inference)
        proofs = ProofHandlers(transparency_log, signing_key, config.server.public_url)
        routes = RouteTable(
            core.routes()
            + inference.routes()
            + embeddings.routes()
            + proofs.routes()
            + sandboxes.routes()
        )
        core.list_endpoints(routes)
        agents = AgentEngine.over_endpoints(
            storage, meter, core.catalog, routes, lease_s=config.agents.lease_s
        )
        await agents.start()  # fails the runs of a dead process; then sweeps
        stack.push_async_callback(agents.stop)  # first to stop: runs settle their steps
        gateway = Gateway(
            config=config,
            catalog=core.catalog,
            metrics=metrics,
            access_log=access_log,
            storage=storage,
            instance=instance,
            keyring=keyring,
            limiter=limiter,
            meter=meter,
            signing_key=signing_key,
            transparency_log=transparency_log,
            log_process=child,
            log_status=log_status,
            providers=providers,
            sandboxes=sandboxes,
            routes=routes,
            agents=agents,
            _closing=stack.pop_all(),
            tracing=tracing,
        )
    gateway.register_gauges()
    for line in startup_summary(config) if seat is None else ():  # workers: the parent's
        log.info("%s", line)
    return gateway


class _LogStatus:
    """The log as this process sees it: its own, or its child's when a child integrates."""

    def __init__(self, own: TransparencyLog, child: LogProcess | None) -> None:
        self.own, self.child = own, child

    @property
    def log_sequencer(self) -> bool:
        """Whether this gateway integrates the log: in its own loop, or in its log process."""
        return self.own.sequencer or (self.child is not None and self.child.sequencer)

    @property
    def log_size(self) -> int:
        """The log's size as last known here: from storage, or as the log process said."""
        return max(self.own.size, 0 if self.child is None else self.child.size)

    @property
    def log_read_back(self) -> int:
        """Receipts read back from storage by the log here and by its log process."""
        return self.own.read_back + (0 if self.child is None else self.child.read_back)


class GatewayApp:
    """ASGI app. Starts on the server's lifespan, or on its first request when mounted in
    a host app that does not forward lifespan (pass `app.lifespan` to the host instead)."""

    def __init__(
        self,
        config: Config,
        on_started: Callable[[], None] | None = None,
        log_process: bool = False,
        seat: WorkerSeat | None = None,
    ) -> None:
        self.config = config
        self.log_process = log_process
        self.seat = seat
        self.nodes = NodePool(config)  # binds a spawned node's port now (ConfigError if taken)
        self.on_started = on_started  # called once started, before the first request
        self.gateway: Gateway | None = None  # once started
        self._pipeline: ASGIApp | None = None
        self._stopped = False  # a gateway stopped stays stopped: its parts are closed
        self._start_lock = asyncio.Lock()

    async def _ensure_started(self) -> ASGIApp:
        async with self._start_lock:
            if self._stopped:
                raise RuntimeError("the gateway has stopped")
            if self._pipeline is None:
                try:
                    gateway = await open_gateway(
                        self.config, self.log_process, self.nodes, self.seat
                    )
                except BaseException:
                    self._stopped = True  # what started is closed, the node pool too
                    raise
                self.gateway = gateway
                self._pipeline = mount_console(gateway, gateway.pipeline())
            return self._pipeline

    async def _stop(self) -> None:
        self._stopped = True
        if self.gateway is not None:
            gateway, self.gateway, self._pipeline = self.gateway, None, None
            await gateway.close()

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: object = None) -> AsyncIterator[None]:
        await self._ensure_started()
        try:
            yield
        finally:
            await self._stop()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._serve_lifespan(receive, send)
            return
        pipeline = self._pipeline or await self._ensure_started()
        await pipeline(scope, receive, send)

    async def _serve_lifespan(self, receive: Receive, send: Send) -> None:
        await receive()  # lifespan.startup
        try:
            await self._ensure_started()  # a part that fails closes those started before it
        except Exception as exc:
            log.error("start-up failed: %s", exc)
            await send({"type": "lifespan.startup.failed", "message": str(exc)})
            return
        if self.on_started is not None:
            self.on_started()
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        await self._stop()
        await send({"type": "lifespan.shutdown.complete"})


def create_app(
    config: Config,
    on_started: Callable[[], None] | None = None,
    log_process: bool = False,
    seat: WorkerSeat | None = None,
) -> GatewayApp:
    """The gateway as an ASGI app (see `open_gateway` for `log_process` and `seat`)."""
    return GatewayApp(config, on_started, log_process, seat)
