"""The app factory: `create_app(config)` returns the gateway as one ASGI app."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from starlette.middleware import Middleware
from starlette.types import ASGIApp

from model_gateway.gateway.access.keyring import KeyRing
from model_gateway.gateway.agents.run_engine import AgentEngine
from model_gateway.gateway.api import CoreHandlers
from model_gateway.gateway.catalog import ConfigCatalog
from model_gateway.gateway.cluster.instance import Instance
from model_gateway.gateway.config import Config
from model_gateway.gateway.console.mount import mount_console
from model_gateway.gateway.inference.handlers import InferenceHandlers
from model_gateway.gateway.metering.leased_meter import LeasedMeter
from model_gateway.gateway.metering.storage_meter import StorageMeter, process_owner
from model_gateway.gateway.ops.logs import AccessLog
from model_gateway.gateway.ops.metrics import Metrics
from model_gateway.gateway.ops.secretfile import load_or_create_secret
from model_gateway.gateway.ops.summary import startup_summary
from model_gateway.gateway.proofs.endpoints import ProofHandlers, log_origin
from model_gateway.gateway.proofs.log import TransparencyLog
from model_gateway.gateway.proofs.log_key import SigningKey, load_or_create_signing_key
from model_gateway.gateway.proofs.log_process import LogProcess
from model_gateway.gateway.providers import Providers
from model_gateway.gateway.ratelimit.limiters import Limiter, open_limiter
from model_gateway.gateway.sandbox.executions import SandboxExecutions
from model_gateway.pipeline import build_pipeline
from model_gateway.pipeline.endpoint import RouteTable
from model_gateway.storage import ReceiptRecord, Storage, open_storage

log = logging.getLogger("gateway")


class Gateway:
    """Everything a request may need, opened at start-up and closed at shutdown."""

    def __init__(self, config: Config, log_process: bool = False) -> None:
        self.config = config
        # The log integrated by a child process (`gateway serve` with [proofs] log_process).
        self.log_process = (
            LogProcess(
                config.storage_url,
                config.path(config.secrets.signing_key_file),
                log_origin(config),
                config.server.log_format,
            )
            if log_process and config.proofs.log_process
            else None
        )
        self.catalog = ConfigCatalog(config)
        self.metrics = Metrics()
        self.access_log = AccessLog(config.server.log_format) if config.server.access_log else None
        self.limiter: Limiter | None = None
        self.storage: Storage | None = None
        self.keyring: KeyRing | None = None
        self.meter: StorageMeter | None = None
        self.instance: Instance | None = None
        self.signing_key: SigningKey | None = None
        self.transparency_log: TransparencyLog | None = None
        self.agents: AgentEngine | None = None
        self.providers = Providers(config)
        core = CoreHandlers(self)
        inference = InferenceHandlers(self.providers, config.limits.gateway_timeout_s, self.metrics)
        proofs = ProofHandlers(self)
        self.sandboxes = SandboxExecutions(self)
        self.routes = RouteTable(
            core.routes() + inference.routes() + proofs.routes() + self.sandboxes.routes()
        )

    async def start(self) -> None:
        pepper = load_or_create_secret(self.config.path(self.config.secrets.key_pepper_file))
        self.storage = await open_storage(self.config.storage_url)
        owner, lease_s = process_owner(), self.config.cluster.lease_s
        self.instance = Instance(self.storage, owner, lease_s)
        await self.instance.start()  # registered and leased before anything is served
        self.keyring = KeyRing(self.storage, pepper, self.instance)
        self.limiter = await open_limiter(self.config, self.storage)
        self.signing_key = load_or_create_signing_key(
            self.config.path(self.config.secrets.signing_key_file)
        )
        self.transparency_log = TransparencyLog(
            self.storage, self.signing_key, origin=log_origin(self.config)
        )
        meter_class = LeasedMeter if self.config.metering.leases else StorageMeter
        self.meter = meter_class(
            self.storage,
            self.metrics,
            owner=owner,
            lease_s=lease_s,
            instance=self.instance,
            on_settling=self._offer_to_the_log,
        )
        await self.meter.start()
        if self.log_process is not None:
            await self.log_process.start()  # first: it takes the sequencer lock
        await self.transparency_log.start()  # integrates, or follows the log process
        self._register_gauges()
        await self.providers.start()
        await self.sandboxes.start()  # node sessions, health checks; spawn = true: the node
        self.agents = AgentEngine.for_gateway(self, lease_s=self.config.agents.lease_s)
        await self.agents.start()  # fails the runs of a dead process; then sweeps
        for line in startup_summary(self.config):
            log.info("%s", line)

    def _offer_to_the_log(self, record: ReceiptRecord) -> None:
        """A receipt being settled, to whichever log integrates here: its own, or the child's."""
        assert self.transparency_log is not None
        self.transparency_log.offer(record)
        if self.log_process is not None:
            self.log_process.offer(record)

    def _register_gauges(self) -> None:
        meter, proofs = self.meter, self.transparency_log
        assert meter is not None and proofs is not None
        self.metrics.gauge(
            "gateway_open_holds", "Holds of this process not yet closed.", lambda: meter.open_holds
        )
        self.metrics.breakers(self.providers.breakers)
        self.metrics.sandbox_nodes(self.sandboxes.pool)
        self.metrics.gauge("gateway_log_size", "Receipts in the signed log.", lambda: self.log_size)
        self.metrics.gauge(
            "gateway_log_integration_lag_seconds",
            "Seconds the oldest receipt not yet logged has waited, as of the log's last look.",
            lambda: proofs.integration_lag_s,
        )
        self.metrics.gauge(
            "gateway_log_sequencer",
            "1 on the one instance that integrates and signs the log, 0 on the others.",
            lambda: float(self.log_sequencer),
        )
        self.metrics.gauge(
            "gateway_log_read_back",
            "Receipts the log read back whole from storage since start: settled by another"
            " instance or before a restart, or not handed over from memory.",
            lambda: self.log_read_back,
        )

    @property
    def log_sequencer(self) -> bool:
        """Whether this gateway integrates the log: in its own loop, or in its log process."""
        assert self.transparency_log is not None
        in_child = self.log_process is not None and self.log_process.sequencer
        return self.transparency_log.sequencer or in_child

    @property
    def log_size(self) -> int:
        """The log's size as last known here: from storage, or as the log process said."""
        assert self.transparency_log is not None
        in_child = 0 if self.log_process is None else self.log_process.size
        return max(self.transparency_log.size, in_child)

    @property
    def log_read_back(self) -> int:
        """Receipts read back from storage by the log here and by its log process."""
        assert self.transparency_log is not None
        in_child = 0 if self.log_process is None else self.log_process.read_back
        return self.transparency_log.read_back + in_child

    def observers(self) -> list:
        """Who hears how each request went (the /v1 chain's Observe stage, the console's):
        the metrics and the access log, as configured."""
        return [
            *([self.metrics] if self.config.metrics.enabled else []),
            *([self.access_log] if self.access_log is not None else []),
        ]

    def pipeline(self, authenticate: Middleware | None = None) -> ASGIApp:
        """The request path over this gateway's parts (call after `start`); `authenticate`
        swaps key auth for another principal (the console playground)."""
        assert self.keyring is not None and self.meter is not None and self.limiter is not None
        config = self.config
        return build_pipeline(
            routes=self.routes,
            keys=self.keyring,
            catalog=self.catalog,
            limiter=self.limiter,
            meter=self.meter if config.metering.enabled else None,
            cors_origins=config.server.cors_origins,
            default_key_rpm=config.limits.default_key_rpm,
            default_project_rpm=config.limits.default_project_rpm,
            observers=self.observers(),
            authenticate=authenticate,
        )

    async def stop(self) -> None:
        if self.agents is not None:
            await self.agents.stop()  # runs settle their steps while everything is open
        await self.sandboxes.close()
        await self.providers.close()
        if self.meter is not None:
            await self.meter.stop()
        if self.limiter is not None:
            await self.limiter.close()
        if self.log_process is not None:
            await self.log_process.stop()  # after the last settlement: it logs them all
        if self.transparency_log is not None:
            await self.transparency_log.stop()
        if self.instance is not None:
            await self.instance.stop()  # deregisters: nothing waits for it any more
        if self.storage is not None:
            await self.storage.close()
        if self.access_log is not None:
            self.access_log.close()


class GatewayApp:
    """ASGI app. Starts on the server's lifespan, or on its first request when mounted in
    a host app that does not forward lifespan (pass `app.lifespan` to the host instead)."""

    def __init__(
        self,
        config: Config,
        on_started: Callable[[], None] | None = None,
        log_process: bool = False,
    ) -> None:
        self.gateway = Gateway(config, log_process)
        self.on_started = on_started  # called once started, before the first request
        self._pipeline = None
        self._start_lock = asyncio.Lock()

    async def _ensure_started(self) -> None:
        async with self._start_lock:
            if self._pipeline is None:
                await self.gateway.start()
                self._pipeline = mount_console(self.gateway, self.gateway.pipeline())

    @contextlib.asynccontextmanager
    async def lifespan(self, _app=None):
        await self._ensure_started()
        try:
            yield
        finally:
            await self.gateway.stop()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._serve_lifespan(receive, send)
            return
        if self._pipeline is None:
            await self._ensure_started()
        await self._pipeline(scope, receive, send)

    async def _serve_lifespan(self, receive, send) -> None:
        await receive()  # lifespan.startup
        try:
            await self._ensure_started()
        except Exception as exc:
            log.error("start-up failed: %s", exc)
            # Close what did start (storage threads, the node, sessions), or the process
            # may hang on them instead of exiting.
            try:
                await self.gateway.stop()
            except Exception:
                log.exception("closing after a failed start-up failed too")
            await send({"type": "lifespan.startup.failed", "message": str(exc)})
            return
        if self.on_started is not None:
            self.on_started()
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        await self.gateway.stop()
        await send({"type": "lifespan.shutdown.complete"})


def create_app(
    config: Config, on_started: Callable[[], None] | None = None, log_process: bool = False
) -> GatewayApp:
    """The gateway as an ASGI app; `log_process` (gateway serve): the transparency log in a
    child process when the config says so (gateway/proofs/log_process.py)."""
    return GatewayApp(config, on_started, log_process)
