"""A credit that would take a balance past 2^63-1 micro-units is refused whole
(AmountOverflow, a StateConflict), on every backend: SQLite would otherwise keep the sum
as an inexact REAL, and PostgreSQL failed it as an unexplained storage error."""

from __future__ import annotations

import secrets

import msgspec
import pytest

from model_gateway.storage import AmountOverflow, StateConflict, open_storage
from model_gateway.storage.base import (
    MAX_AMOUNT,
    PaymentRecord,
    ProjectRecord,
    PurchaseRecord,
    new_id,
)

MONTH = "2026-11"


@pytest.fixture
async def storage(storage_url):
    backend = await open_storage(storage_url)
    yield backend
    await backend.close()


async def test_a_credit_past_64_bits_is_refused_whole(storage):
    pid = new_id("prj")
    await storage.create_project(ProjectRecord(id=pid, name="rich", created_at=1))
    await storage.add_credit(pid, MAX_AMOUNT - 10, MONTH)
    payment = PaymentRecord(
        id=new_id("pay"), project_id=pid, reference="INV-1", amount=11, month=MONTH
    )
    purchase = PurchaseRecord(
        tx_hash="0x" + secrets.token_hex(32),
        project_id=pid,
        sender="0x" + "1" * 40,
        token_units=11,
        amount=11,
        month=MONTH,
    )
    for refused in (
        storage.add_credit(pid, 11, MONTH),
        storage.record_payment(payment),
        storage.record_purchase(purchase),
    ):
        with pytest.raises(AmountOverflow) as caught:
            await refused
        assert isinstance(caught.value, StateConflict)  # 409 conflict; the CLI's `conflict`
    assert (await storage.project_account(pid, MONTH)).balance == MAX_AMOUNT - 10
    assert len(await storage.list_ledger(pid, 10, None)) == 1
    assert await storage.get_purchase(purchase.tx_hash) is None
    # Up to the limit itself, exactly, and the refused reference is still free.
    await storage.record_payment(msgspec.structs.replace(payment, amount=10))
    balance = (await storage.project_account(pid, MONTH)).balance
    assert balance == MAX_AMOUNT and type(balance) is int
    audit = await storage.audit(pid, MONTH)
    assert audit.balance == audit.ledger_sum == MAX_AMOUNT
