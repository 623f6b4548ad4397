"""The endpoints of the service and their handlers (routing, scopes and decoding are in routes)."""

from __future__ import annotations

import time

from gateway.catalog import ModelCatalog
from gateway.money import format_amount
from gateway.responses import json_response
from gateway.routes import ANY_VALID_KEY, PUBLIC, Endpoint
from pipeline.context import RequestContext


def _price(micros: int | None) -> str | None:
    return None if micros is None else format_amount(micros)


class CoreHandlers:
    """Endpoints that need nothing but the catalog and the route table."""

    def __init__(self, catalog: ModelCatalog) -> None:
        self.catalog = catalog
        self.started = int(time.time())
        self.endpoints: list[Endpoint] = []

    def routes(self) -> list[Endpoint]:
        return [
            Endpoint("GET", "/healthz", PUBLIC, self.healthz, listed=False),
            Endpoint("GET", "/v1", ANY_VALID_KEY, self.index),
            Endpoint("GET", "/v1/models", ANY_VALID_KEY, self.models),
        ]

    async def healthz(self, ctx: RequestContext):
        return json_response({"status": "ok"})

    async def index(self, ctx: RequestContext):
        data = [
            {
                "method": ep.method,
                "path": ep.path,
                "scope": None if ep.scope == ANY_VALID_KEY else ep.scope,
            }
            for ep in self.endpoints
            if ep.listed
        ]
        return json_response({"object": "list", "data": data})

    async def models(self, ctx: RequestContext):
        data = [
            {
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
            for model_id, model in self.catalog.visible_to(ctx.key, ctx.project)
        ]
        return json_response({"object": "list", "data": data})
