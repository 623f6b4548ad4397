"""The endpoints of the service and their handlers (routing, scopes and decoding are in routes)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from gateway.errors import NotFound, ServiceUnavailable
from gateway.money import format_amount
from gateway.responses import json_response
from gateway.routes import ANY_VALID_KEY, PUBLIC, Endpoint
from pipeline.context import RequestContext
from storage import ReceiptRecord, StorageError


def _price(micros: int | None) -> str | None:
    return None if micros is None else format_amount(micros)


def receipt_view(receipt: ReceiptRecord) -> dict:
    issued = datetime.fromtimestamp(receipt.created_at / 1_000_000, UTC)
    subject = "model" if receipt.kind == "inference" else "runtime"
    return {
        "id": receipt.id,
        "object": "receipt",
        "status": receipt.status,
        "kind": receipt.kind,
        "endpoint": receipt.endpoint,
        subject: receipt.model_or_runtime,
        "usage": receipt.usage,
        "cost": format_amount(receipt.cost),
        "currency": "USD",
        "created_at": issued.isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "request_id": receipt.request_id,
        "request_sha256": receipt.request_sha256,
        "response_sha256": receipt.response_sha256,
        "proof_url": f"/api/proofs/{receipt.id}",
    }


class CoreHandlers:
    """The service's own endpoints: health, the endpoint list, models and receipts."""

    def __init__(self, gateway) -> None:
        self.gateway = gateway
        self.catalog = gateway.catalog
        self.started = int(time.time())

    def routes(self) -> list[Endpoint]:
        return [
            Endpoint("GET", "/healthz", PUBLIC, self.healthz, listed=False),
            Endpoint("GET", "/v1", ANY_VALID_KEY, self.index),
            Endpoint("GET", "/v1/models", ANY_VALID_KEY, self.models),
            Endpoint("GET", "/v1/receipts/{receipt_id}", "receipts", self.receipt),
        ]

    async def healthz(self, ctx: RequestContext):
        try:
            await self.gateway.storage.health()
        except StorageError:
            raise ServiceUnavailable("The gateway's storage is not answering.") from None
        return json_response({"status": "ok"})

    async def index(self, ctx: RequestContext):
        data = [
            {
                "method": ep.method,
                "path": ep.path,
                "scope": None if ep.scope == ANY_VALID_KEY else ep.scope,
            }
            for ep in self.gateway.routes.endpoints
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

    async def receipt(self, ctx: RequestContext):
        receipt = await self.gateway.storage.get_receipt(ctx.path_params["receipt_id"])
        # Another project's receipt is as absent as a missing one.
        if receipt is None or receipt.project_id != ctx.project.id:
            raise NotFound("No receipt with this ID exists.")
        return json_response(receipt_view(receipt))
