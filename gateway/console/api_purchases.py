"""Onchain purchases as the console's JSON API: POST .../purchases {tx_hash} verifies a
transaction and credits it; GET .../purchases/{tx_hash} only reports where it stands."""

from __future__ import annotations

from typing import TYPE_CHECKING, NotRequired, TypedDict

from starlette.responses import Response

from model_gateway.gateway.admin import money_admin
from model_gateway.gateway.admin.admin_views import iso, project_view
from model_gateway.gateway.console.api_money import BALANCE_FULL
from model_gateway.gateway.console.call import SESSION, Call, route
from model_gateway.gateway.console.guard import project_of, require_active
from model_gateway.gateway.console.onchain import (
    RETRY_S,
    AwaitingConfirmations,
    ChainReader,
    tx_hash_of,
)
from model_gateway.gateway.console.payload import Fields
from model_gateway.gateway.json_response import json_response
from model_gateway.gateway.metering.money import format_amount
from model_gateway.gateway.metering.storage_meter import current_month
from model_gateway.pipeline.endpoint import Endpoint
from model_gateway.pipeline.errors import Conflict, NotFound, ServiceUnavailable
from model_gateway.storage import AmountOverflow, StateConflict
from model_gateway.storage.base import ProjectRecord, PurchaseRecord, now_s

if TYPE_CHECKING:
    from model_gateway.gateway.console.mount import Console

_PROJECT = "/console/api/projects/{project_id}"
NOT_CONFIGURED = "Onchain purchases are not configured on this deployment."
ALREADY_CREDITED = "This transaction is already credited."


class PurchaseView(TypedDict):
    object: str
    status: str  # credited | confirmed
    tx_hash: str
    project: str
    sender: str
    token_units: str
    amount: str
    created_at: NotRequired[str | None]  # credited only


def purchase_view(purchase: PurchaseRecord, status: str = "credited") -> PurchaseView:
    """A purchase credited, or (status "confirmed") one that a POST would credit now."""
    view: PurchaseView = {
        "object": "purchase",
        "status": status,
        "tx_hash": purchase.tx_hash,
        "project": purchase.project_id,
        "sender": purchase.sender,
        "token_units": str(purchase.token_units),
        "amount": format_amount(purchase.amount),
    }
    if status == "credited":
        view["created_at"] = iso(purchase.created_at)
    return view


def routes(console: Console) -> list[Endpoint]:
    storage, admin = console.storage, console.admin
    settings = console.config.purchases
    chain = ChainReader(settings) if settings is not None else None

    async def confirmed(project: ProjectRecord, tx_hash: str) -> PurchaseRecord | Response:
        """The purchase the confirmed transfer makes for the project (not yet stored), or
        the 202 answer while it lacks confirmations."""
        if chain is None:
            raise ServiceUnavailable(NOT_CONFIGURED)
        try:
            transfer = await chain.transfer(tx_hash, await storage.payer_addresses(project.id))
        except AwaitingConfirmations as pending:
            body = {
                "object": "purchase",
                "status": "pending",
                "tx_hash": tx_hash,
                "confirmations": pending.confirmations,
                "confirmations_needed": pending.needed,
            }
            return json_response(body, status=202, headers={"retry-after": str(RETRY_S)})
        return PurchaseRecord(
            tx_hash=tx_hash,
            project_id=project.id,
            sender=transfer.sender,
            token_units=transfer.token_units,
            amount=transfer.amount,
            month=current_month(),
            created_at=now_s(),
        )

    async def post(call: Call) -> Response:
        project = await project_of(storage, call)
        fields = Fields(await call.json())
        tx_hash = tx_hash_of(fields.string("tx_hash", required=True, max_length=80))
        fields.unknown()
        require_active(project)
        if await storage.get_purchase(tx_hash) is not None:
            raise Conflict(ALREADY_CREDITED)
        record = await confirmed(project, tx_hash)
        if not isinstance(record, PurchaseRecord):
            return record  # pending
        try:
            await money_admin.credit_purchase(admin, record)
        except AmountOverflow:
            raise Conflict(BALANCE_FULL) from None
        except StateConflict:
            raise Conflict(ALREADY_CREDITED) from None
        view = await project_view(admin, project)
        return json_response({**purchase_view(record), "balance": view["balance"]}, status=201)

    async def get(call: Call) -> Response:
        # Reads only: a GET skips the Origin check, so it must never credit anything.
        project = await project_of(storage, call)
        tx_hash = tx_hash_of(call.params["tx_hash"])
        found = await storage.get_purchase(tx_hash)
        if found is not None:
            if found.project_id != project.id:
                raise NotFound("No purchase with this transaction in this project.")
            return json_response(purchase_view(found))
        record = await confirmed(project, tx_hash)
        if not isinstance(record, PurchaseRecord):
            return record  # pending
        return json_response(purchase_view(record, "confirmed"))

    return [
        route("POST", _PROJECT + "/purchases", SESSION, post),
        route("GET", _PROJECT + "/purchases/{tx_hash}", SESSION, get),
    ]
