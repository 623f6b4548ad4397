"""The app factory: `create_app(config)` returns the gateway as one ASGI app."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gateway.api import CoreHandlers
from gateway.catalog import ModelCatalog
from gateway.config import Config
from gateway.inference.handlers import InferenceHandlers
from gateway.keyring import KeyRing
from gateway.metering import Meter
from gateway.proofs.log import TransparencyLog
from gateway.proofs.routes import ProofHandlers
from gateway.proofs.signing import SigningKey, load_or_create_signing_key
from gateway.providers import Providers
from gateway.ratelimit import Gcra
from gateway.routes import RouteTable
from gateway.sandbox.executions import SandboxExecutions
from gateway.secretfile import load_or_create_secret
from pipeline import build_pipeline
from storage import Storage, open_storage

log = logging.getLogger("gateway")


class Gateway:
    """Everything a request may need, opened at start-up and closed at shutdown."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.catalog = ModelCatalog(config)
        self.limiter = Gcra()
        self.storage: Storage | None = None
        self.keyring: KeyRing | None = None
        self.meter: Meter | None = None
        self.signing_key: SigningKey | None = None
        self.transparency_log: TransparencyLog | None = None
        self.providers = Providers(config)
        core = CoreHandlers(self)
        inference = InferenceHandlers(self.providers, config.limits.gateway_timeout_s)
        proofs = ProofHandlers(self)
        self.sandboxes = SandboxExecutions(self)
        self.routes = RouteTable(
            core.routes() + inference.routes() + proofs.routes() + self.sandboxes.routes()
        )

    async def start(self) -> None:
        pepper = load_or_create_secret(self.config.path(self.config.secrets.key_pepper_file))
        self.storage = await open_storage(self.config.storage_url)
        self.keyring = KeyRing(self.storage, pepper)
        self.meter = Meter(self.storage)
        await self.meter.start()
        self.signing_key = load_or_create_signing_key(
            self.config.path(self.config.secrets.signing_key_file)
        )
        self.transparency_log = TransparencyLog(self.storage, self.signing_key)
        await self.transparency_log.start()  # integrates receipts in the background
        await self.providers.start()
        await self.sandboxes.start()  # node session; with spawn = true, the local node

    async def stop(self) -> None:
        await self.sandboxes.close()
        await self.providers.close()
        if self.meter is not None:
            await self.meter.stop()
        if self.transparency_log is not None:
            await self.transparency_log.stop()
        if self.storage is not None:
            await self.storage.close()


class GatewayApp:
    """ASGI app. Starts on the server's lifespan, or on its first request when mounted in
    a host app that does not forward lifespan (pass `app.lifespan` to the host instead)."""

    def __init__(self, config: Config) -> None:
        self.gateway = Gateway(config)
        self._pipeline = None
        self._start_lock = asyncio.Lock()

    async def _ensure_started(self) -> None:
        async with self._start_lock:
            if self._pipeline is None:
                await self.gateway.start()
                self._pipeline = build_pipeline(self.gateway)

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
            await send({"type": "lifespan.startup.failed", "message": str(exc)})
            return
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        await self.gateway.stop()
        await send({"type": "lifespan.shutdown.complete"})


def create_app(config: Config) -> GatewayApp:
    return GatewayApp(config)
