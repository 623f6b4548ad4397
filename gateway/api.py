"""The endpoints of the service and their handlers (routing, scopes and decoding are in routes)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from model_gateway.gateway.config import Config, ModelConfig
from model_gateway.gateway.json_response import json_response
from model_gateway.gateway.metering.class_prices import split_usage
from model_gateway.gateway.metering.money import format_amount
from model_gateway.gateway.ops.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from model_gateway.gateway.proofs.links import link_base
from model_gateway.pipeline.context import RequestContext
from model_gateway.pipeline.endpoint import ANY_VALID_KEY, PUBLIC, Endpoint, RouteTable
from model_gateway.pipeline.errors import ModelNotFound, NotFound, ServiceUnavailable
from model_gateway.pipeline.policy import model_allowed
from model_gateway.storage import ReceiptRecord, Storage, StorageError

if TYPE_CHECKING:
    from model_gateway.gateway.catalog import ConfigCatalog
    from model_gateway.gateway.cluster.instance import Instance
    from model_gateway.gateway.ops.metrics import Metrics
    from model_gateway.gateway.routing.breaker import Breakers
    from model_gateway.gateway.sandbox.pool import NodePool


def _price(micros: int | None) -> str | None:
    return None if micros is None else format_amount(micros)


def receipt_view(receipt: ReceiptRecord, link_prefix: str = "") -> dict[str, object]:
    """The project's own view of its receipt: what the public proof shows, plus what only
    the project may see (the plain digests, and the salts that open the commitments).
    `link_prefix` starts proof_url (gateway.proofs.links.link_base: never from Host)."""
    issued = datetime.fromtimestamp(receipt.created_at / 1_000_000, UTC)
    subject = "model" if receipt.kind == "inference" else "runtime"
    counts, prices = split_usage(receipt.usage)
    priced = {"prices": {k: format_amount(v) for k, v in prices.items()}} if prices else {}
    return {
        "id": receipt.id,
        "object": "receipt",
        "status": receipt.status,
        "kind": receipt.kind,
        "endpoint": receipt.endpoint,
        subject: receipt.model_or_runtime,
        "usage": counts,
        "usage_source": receipt.usage_source,
        "provider": receipt.provider,
        "cost": format_amount(receipt.cost),
        "currency": "USD",
        "created_at": issued.isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "request_id": receipt.request_id,
        "request_sha256": receipt.request_sha256,
        "response_sha256": receipt.response_sha256,
        # None on receipts issued before salted commitments (public receipt version 1).
        "request_salt": receipt.request_salt,
        "response_salt": receipt.response_salt,
        "request_commitment": receipt.request_commitment,
        "response_commitment": receipt.response_commitment,
        "proof_url": f"{link_prefix}/api/proofs/{receipt.id}",
        **priced,  # each class's price applied, USD per million tokens (receipts since v3)
    }


class LogStatus(Protocol):
    """The transparency log as this process sees it (gateway.app.Gateway)."""

    @property
    def log_sequencer(self) -> bool: ...
    @property
    def log_size(self) -> int: ...


class CoreHandlers:
    """The service's own endpoints: health, the endpoint list, models and receipts."""

    def __init__(
        self,
        *,
        config: Config,
        catalog: ConfigCatalog,
        storage: Storage,
        instance: Instance,
        breakers: Breakers,
        nodes: NodePool,
        log: LogStatus,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.storage = storage
        self.instance = instance
        self.breakers = breakers
        self.nodes = nodes
        self.log = log
        self.counters = metrics
        self.listed: list[Endpoint] = []  # the routes' endpoints, once the table is made
        self.started = int(time.time())

    def list_endpoints(self, routes: RouteTable) -> None:
        """What `GET /v1` lists: the table holds these handlers too, so it comes after."""
        self.listed = [ep for ep in routes.endpoints if ep.listed]

    def routes(self) -> list[Endpoint]:
        return [
            Endpoint("GET", "/", PUBLIC, self.home, listed=False),
            Endpoint("GET", "/healthz", PUBLIC, self.healthz, listed=False),
            Endpoint("GET", "/metrics", PUBLIC, self.metrics, listed=False),
            Endpoint("GET", "/v1", ANY_VALID_KEY, self.index),
            Endpoint("GET", "/v1/models", ANY_VALID_KEY, self.models),
            # Model ids may hold slashes (org/model): the parameter takes the rest of the path.
            Endpoint("GET", "/v1/models/{model_id:path}", ANY_VALID_KEY, self.model),
            Endpoint("GET", "/v1/receipts/{receipt_id}", "receipts", self.receipt),
        ]

    async def home(self, ctx: RequestContext) -> ASGIApp:
        """A browser at the gateway's address lands on the console (behind the mount
        prefix, when the gateway is embedded under one)."""

        async def respond(scope: Scope, receive: Receive, send: Send) -> None:
            to = scope.get("root_path", "").rstrip("/") + "/console"
            await RedirectResponse(to, status_code=303)(scope, receive, send)

        return respond

    async def healthz(self, ctx: RequestContext) -> Response:
        try:
            await self.storage.health()
        except StorageError:
            raise ServiceUnavailable("The gateway's storage is not answering.") from None
        self.instance.check_serving()  # fenced: the load balancer looks elsewhere
        # Detail beside the status (decisions.md allows it): each provider's breaker, each
        # sandbox node's health and slots (named by its place in the config, not its URL),
        # and whether this instance is the log's sequencer (one instance of a deployment is).
        states = self.breakers.states()
        providers = {name: {"breaker": state} for name, state in states.items()}
        nodes = self.nodes.states()
        transparency_log = {"sequencer": self.log.log_sequencer, "size": self.log.log_size}
        return json_response(
            {
                "status": "ok",
                "providers": providers,
                "sandbox_nodes": nodes,
                "log": transparency_log,
            }
        )

    async def metrics(self, ctx: RequestContext) -> Response:
        if not self.config.metrics.enabled:
            raise NotFound("Metrics are turned off on this deployment.")
        return Response(await self.counters.server_text(), media_type=METRICS_CONTENT_TYPE)

    async def index(self, ctx: RequestContext) -> Response:
        data = [
            {
                "method": ep.method,
                "path": ep.path,
                "scope": None if ep.scope == ANY_VALID_KEY else ep.scope,
            }
            for ep in self.listed
        ]
        return json_response({"object": "list", "data": data})

    def _model_view(self, model_id: str, model: ModelConfig) -> dict[str, object]:
        return {
            "id": model_id,
            "object": "model",
            "created": self.started,
            "owned_by": model.provider,
            "available": self.catalog.available(model),
            "supports_tools": model.supports_tools,
            "max_output_tokens": model.max_output_tokens,
            "input_price_per_mtok": _price(model.input_price_per_mtok),
            "output_price_per_mtok": _price(model.output_price_per_mtok),
        }

    async def models(self, ctx: RequestContext) -> Response:
        assert ctx.project is not None
        data = [
            self._model_view(model_id, model)
            for model_id, model in self.catalog.visible_to(ctx.key, ctx.project)
        ]
        return json_response({"object": "list", "data": data})

    async def model(self, ctx: RequestContext) -> Response:
        """The SDK's `models.retrieve`: a model the key may not use is as absent as none."""
        assert ctx.project is not None
        asked = ctx.path_params["model_id"]
        found = self.catalog.resolve(asked)
        if found is None or not model_allowed(found[0], ctx.key, ctx.project):
            raise ModelNotFound("No model with this ID exists.")
        return json_response(self._model_view(asked, found[1]))  # named as it was asked

    async def receipt(self, ctx: RequestContext) -> ASGIApp:
        assert ctx.project is not None  # key auth ran
        receipt = await self.storage.get_receipt(ctx.path_params["receipt_id"])
        # Another project's receipt is as absent as a missing one.
        if receipt is None or receipt.project_id != ctx.project.id:
            raise NotFound("No receipt with this ID exists.")
        public_url = self.config.server.public_url

        # An ASGI app rather than a response: proof_url needs the mount prefix, which only
        # the scope carries.
        async def respond(scope: Scope, receive: Receive, send: Send) -> None:
            view = receipt_view(receipt, link_base(public_url, scope))
            await json_response(view)(scope, receive, send)

        return respond
