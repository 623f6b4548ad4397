"""Onchain purchases as the console's JSON API: POST .../purchases {tx_hash}, and
GET .../purchases/{tx_hash} to ask again while confirmations are missing."""

from __future__ import annotations

from model_gateway.gateway import cli
from model_gateway.gateway.console.guard import project_of, require_active
from model_gateway.gateway.console.mount import SESSION, Call
from model_gateway.gateway.console.onchain import (
    RETRY_S,
    AwaitingConfirmations,
    ChainReader,
    tx_hash_of,
)
from model_gateway.gateway.console.payload import Fields
from model_gateway.gateway.console.views import iso
from model_gateway.gateway.json_response import json_response
from model_gateway.gateway.metering import current_month
from model_gateway.gateway.money import format_amount
from model_gateway.pipeline.endpoint import Endpoint
from model_gateway.pipeline.errors import Conflict, NotFound, ServiceUnavailable
from model_gateway.storage import StateConflict
from model_gateway.storage.base import PurchaseRecord, now_s

_PROJECT = "/console/api/projects/{project_id}"
NOT_CONFIGURED = "Onchain purchases are not configured on this deployment."


def purchase_view(purchase: PurchaseRecord) -> dict:
    return {
        "object": "purchase",
        "status": "credited",
        "tx_hash": purchase.tx_hash,
        "project": purchase.project_id,
        "sender": purchase.sender,
        "token_units": str(purchase.token_units),
        "amount": format_amount(purchase.amount),
        "created_at": iso(purchase.created_at),
    }


def routes(console) -> list[Endpoint]:
    storage = console.storage
    settings = console.config.purchases
    chain = ChainReader(settings) if settings is not None else None

    async def credit(project, tx_hash: str, status: int):
        """Verify the transaction and credit it once; 202 while it lacks confirmations."""
        if chain is None:
            raise ServiceUnavailable(NOT_CONFIGURED)
        if await storage.get_purchase(tx_hash) is not None:
            raise Conflict("This transaction is already credited.")
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
        record = PurchaseRecord(
            tx_hash=tx_hash,
            project_id=project.id,
            sender=transfer.sender,
            token_units=transfer.token_units,
            amount=transfer.amount,
            month=current_month(),
            created_at=now_s(),
        )
        try:
            await storage.record_purchase(record)
        except StateConflict:
            raise Conflict("This transaction is already credited.") from None
        view = await cli.project_view(storage, project)
        return json_response({**purchase_view(record), "balance": view["balance"]}, status=status)

    async def post(call: Call):
        project = await project_of(storage, call)
        fields = Fields(await call.json())
        tx_hash = tx_hash_of(fields.string("tx_hash", required=True, max_length=80))
        fields.unknown()
        require_active(project)
        return await credit(project, tx_hash, 201)

    async def get(call: Call):
        project = await project_of(storage, call)
        tx_hash = tx_hash_of(call.params["tx_hash"])
        found = await storage.get_purchase(tx_hash)
        if found is not None:
            if found.project_id != project.id:
                raise NotFound("No purchase with this transaction in this project.")
            return json_response(purchase_view(found))
        require_active(project)
        return await credit(project, tx_hash, 200)

    return [
        Endpoint("POST", _PROJECT + "/purchases", SESSION, post),
        Endpoint("GET", _PROJECT + "/purchases/{tx_hash}", SESSION, get),
    ]
