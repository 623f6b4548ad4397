"""The console's storage (users, grants, sessions, the sign-in throttle, payments,
purchases, the read models of its pages), on every backend."""

from __future__ import annotations

import asyncio

import pytest

from model_gateway.storage import open_storage
from model_gateway.storage.base import (
    KeyRecord,
    PaymentRecord,
    ProjectRecord,
    PurchaseRecord,
    ReceiptRecord,
    RecordNotFound,
    ReservationRecord,
    SandboxRecord,
    StateConflict,
    StorageError,
    UserRecord,
    new_id,
)

MONTH = "2026-11"


@pytest.fixture
async def storage(fresh_storage_url):
    """An empty database of each backend: the first user becomes the owner."""
    backend = await open_storage(fresh_storage_url)
    yield backend
    await backend.close()


def user(email: str) -> UserRecord:
    return UserRecord(id=new_id("usr"), email=email, password_hash="$argon2id$x", created_at=1)


async def funded(storage, amount: int = 1_000, created_at: int = 0) -> str:
    pid = new_id("prj")
    await storage.create_project(ProjectRecord(id=pid, name="c", created_at=created_at))
    if amount:
        await storage.add_credit(pid, amount, MONTH)
    return pid


async def test_users_roles_sessions_and_grants(storage):
    owner = await storage.create_user(user("Ann@Example.com"), None)
    member = await storage.create_user(user("bob@example.com"), None)
    assert (owner.role, member.role) == ("owner", "member")
    with pytest.raises(StateConflict):
        await storage.create_user(user("ANN@example.com"), None)
    assert await storage.get_user("ann@EXAMPLE.com") == owner
    assert await storage.get_user("nobody@example.com") is None
    assert await storage.list_users() == [owner, member]

    pid = await funded(storage, 0)
    await storage.grant_project("bob@example.com", pid)
    await storage.grant_project("bob@example.com", pid)  # twice: a no-op
    assert await storage.granted_projects(member.id) == {pid}
    with pytest.raises(RecordNotFound):
        await storage.grant_project("nobody@example.com", pid)
    with pytest.raises(RecordNotFound):
        await storage.grant_project("bob@example.com", "prj_missing")

    await storage.create_session(b"s" * 32, member.id, 100)
    assert await storage.session_user(b"s" * 32, 100) == member
    assert await storage.session_user(b"s" * 32, 101) is None  # idle too long
    await storage.touch_session(b"s" * 32, 200)
    assert await storage.session_user(b"s" * 32, 150) == member
    disabled = await storage.disable_user("BOB@example.com")
    assert disabled.disabled
    assert await storage.session_user(b"s" * 32, 0) is None
    with pytest.raises(RecordNotFound):
        await storage.disable_user("nobody@example.com")

    await storage.create_session(b"t" * 32, owner.id, 100)
    await storage.delete_session(b"t" * 32)
    await storage.delete_session(b"t" * 32)
    assert await storage.session_user(b"t" * 32, 0) is None
    await storage.create_session(b"u" * 32, owner.id, 100)
    await storage.purge_console(sessions_seen_before=101, failures_before=0)
    assert await storage.session_user(b"u" * 32, 0) is None


async def test_two_first_users_at_once_make_one_owner(fresh_storage_url):
    handles = [await open_storage(fresh_storage_url) for _ in range(2)]
    try:
        made = await asyncio.gather(
            *(h.create_user(user(f"u{i}@example.com"), None) for i, h in enumerate(handles))
        )
        assert sorted(u.role for u in made) == ["member", "owner"]
    finally:
        for handle in handles:
            await handle.close()


async def test_the_sign_in_throttle(storage):
    await storage.record_login_failure(["email:a@example.com", "addr:10.0.0.1"], 10)
    await storage.record_login_failure(["email:a@example.com"], 20)
    assert await storage.login_failures("email:a@example.com", 0) == [10, 20]
    assert await storage.login_failures("email:a@example.com", 15) == [20]
    assert await storage.login_failures("addr:10.0.0.1", 0) == [10]
    await storage.clear_login_failures("email:a@example.com")
    assert await storage.login_failures("email:a@example.com", 0) == []
    await storage.purge_console(sessions_seen_before=0, failures_before=11)
    assert await storage.login_failures("addr:10.0.0.1", 0) == []


async def test_projects_and_keys_listed_and_updated(storage):
    older, newer = await funded(storage, 0, 5), await funded(storage, 0, 6)
    same_time = await funded(storage, 0, 6)
    listed = [p.id for p in await storage.list_projects()]
    assert listed == [same_time, newer, older]
    assert [p.id for p in await storage.list_projects({older, "prj_missing"})] == [older]
    assert await storage.list_projects(set()) == []

    updated = await storage.update_project(
        older, {"monthly_budget": 500, "allow_models": ["b", "a"], "rpm": 7}
    )
    assert (updated.monthly_budget, updated.allow_models, updated.rpm) == (500, ["a", "b"], 7)
    assert await storage.get_project(older) == updated
    assert (await storage.update_project(older, {"name": "renamed"})).name == "renamed"
    with pytest.raises(StorageError):  # only the columns a PATCH may change
        await storage.update_project(older, {"state": "archived"})
    with pytest.raises(RecordNotFound):
        await storage.update_project("prj_missing", {"rpm": 1})
    await storage.archive_project(newer)
    with pytest.raises(StateConflict):
        await storage.update_project(newer, {"rpm": 1})

    keys = []
    for _ in range(2):
        k = KeyRecord(
            id=new_id("key"),
            prefix=f"proj_live_{new_id('k')}",
            key_hash=b"h",
            project_id=older,
            scopes=frozenset({"inference"}),
            created_at=9,
        )
        keys.append(await storage.create_key(k))
    changed = await storage.update_key(
        keys[0].prefix, {"name": "ci", "models": ["z", "y"], "monthly_limit": 40}
    )
    assert (changed.models, changed.monthly_limit) == (["y", "z"], 40)
    listing = await storage.list_keys(older)
    assert [x.key.id for x in listing] == [keys[1].id, keys[0].id]
    assert (listing[1].name, listing[1].last_used_at, listing[0].name) == ("ci", None, None)
    await storage.revoke_key(keys[1].prefix)
    with pytest.raises(StateConflict):
        await storage.update_key(keys[1].prefix, {"rpm": 1})
    with pytest.raises(RecordNotFound):
        await storage.update_key("proj_live_missing", {"rpm": 1})


async def settle(storage, pid, key_id, n, *, kind="inference", model="m1", usage=None, at=0):
    hold = ReservationRecord(
        id=new_id("rsv"),
        project_id=pid,
        key_id=key_id,
        amount=100,
        month=MONTH,
        owner="c:1:1",
        lease_until=2**40,
        created_at=0,
    )
    await storage.reserve(hold)
    receipt = ReceiptRecord(
        id=new_id("rcpt"),
        reservation_id=hold.id,
        project_id=pid,
        key_id=key_id,
        request_id=f"req_{n}",
        kind=kind,
        endpoint="/v1/responses",
        model_or_runtime=model,
        status="succeeded",
        usage=usage or {"input_tokens": 2, "output_tokens": 3},
        cost=10 + n,
        month=MONTH,
        created_at=at,
        request_sha256="a" * 64,
        response_sha256="b" * 64,
    )
    assert await storage.settle(receipt)
    return receipt


async def test_usage_receipts_and_ledger_pages(storage):
    pid = await funded(storage, 10_000)
    k = await storage.create_key(
        KeyRecord(
            id=new_id("key"),
            prefix="proj_live_usage" + new_id("x"),
            key_hash=b"h",
            project_id=pid,
            scopes=frozenset({"inference"}),
        )
    )
    day = 86_400 * 10**6
    r0 = await settle(storage, pid, k.id, 0, at=20_000 * day)
    r1 = await settle(storage, pid, None, 1, model="m2", at=20_000 * day + 5)
    r2 = await settle(
        storage, pid, None, 2, kind="sandbox", model="python", usage={"duration_ms": 70},
        at=20_001 * day,
    )  # fmt: skip
    by_day = await storage.usage(pid, 0, 2**62, "day")
    assert [(u["group"], u["requests"], u["cost"]) for u in by_day] == [
        ("2024-10-04", 2, 21),
        ("2024-10-05", 1, 12),
    ]
    assert (by_day[0]["input_tokens"], by_day[0]["output_tokens"], by_day[1]["sandbox_ms"]) == (
        4,
        6,
        70,
    )
    by_model = await storage.usage(pid, 0, 20_001 * day, "model")
    assert [(u["group"], u["requests"]) for u in by_model] == [("m1", 1), ("m2", 1)]
    by_key = await storage.usage(pid, 0, 2**62, "key")
    assert sorted((u["group"] or "", u["requests"]) for u in by_key) == [("", 2), (k.prefix, 1)]

    page = await storage.list_receipts(pid, 2, None)
    assert [r for _, r in page] == [r2, r1]
    rest = await storage.list_receipts(pid, 2, page[-1][0])
    assert [r for _, r in rest] == [r0]
    listing = await storage.list_keys(pid)
    assert listing[0].last_used_at == r0.created_at // 10**6

    ledger = await storage.list_ledger(pid, 3, None)
    assert [(e.kind, e.amount, e.receipt_id) for e in ledger] == [
        ("charge", 12, r2.id),
        ("charge", 11, r1.id),
        ("charge", 10, r0.id),
    ]
    older = await storage.list_ledger(pid, 3, ledger[-1].id)
    assert [(e.kind, e.amount) for e in older] == [("credit", 10_000)]


def priced(cached: int, input_price: int, cached_price: int, **classes: int) -> dict[str, int]:
    """A usage priced by class, as settlement stores it: the classes (those not 0) and the
    five prices applied (micro-units per million tokens)."""
    return {
        "input_tokens": cached + classes.get("cache_write_tokens", 0) + 10,
        "output_tokens": 5 + classes.get("reasoning_tokens", 0),
        **({"cached_input_tokens": cached} if cached else {}),
        **classes,
        "input_price_per_mtok": input_price,
        "cached_input_price_per_mtok": cached_price,
        "cache_write_price_per_mtok": input_price * 5 // 4,
        "cache_write_1h_price_per_mtok": input_price * 2,
        "output_price_per_mtok": input_price * 5,
    }


async def test_usage_sums_the_token_classes_and_what_cache_reads_saved(storage):
    pid = await funded(storage, 10_000)
    day = 86_400 * 10**6
    at = 20_000 * day
    # m1: 600 reads at 3.00 instead of 0.30 per MTok save 1620 micro-units exactly; two
    # reads that save 0.6 each are 1.2, rounded down once for the group: 1 (per receipt,
    # down: 0; up: 2). One receipt also wrote to the cache (never a saving) and reasoned.
    m1 = [
        priced(600, 3_000_000, 300_000, cache_write_tokens=100, reasoning_tokens=20),
        priced(1, 700_000, 100_000),
        priced(1, 700_000, 100_000, cache_write_tokens=3),
    ]
    for n, usage in enumerate(m1):
        await settle(storage, pid, None, n, usage=usage, at=at + n)
    # m2: a receipt from before classes and prices, one with a class but no prices applied
    # (neither saves anything), one without cache reads.
    await settle(storage, pid, None, 3, model="m2", at=at + day)
    old = {"input_tokens": 9, "output_tokens": 2, "cached_input_tokens": 4}
    await settle(storage, pid, None, 4, model="m2", usage=old, at=at + day)
    await settle(storage, pid, None, 5, model="m2", usage=priced(0, 500, 50), at=at + day)
    await settle(
        storage, pid, None, 6, kind="sandbox", model="python", usage={"duration_ms": 9},
        at=at + day,
    )  # fmt: skip

    def sums(rows):
        keys = ("requests", "cached_input_tokens", "cache_write_tokens", "reasoning_tokens")
        return {u["group"]: (*(u[k] for k in keys), u["cache_savings"]) for u in rows}

    assert sums(await storage.usage(pid, 0, 2**62, "model")) == {
        "m1": (3, 602, 103, 20, 1621),
        "m2": (3, 4, 0, 0, 0),
        "python": (1, 0, 0, 0, 0),
    }
    assert sums(await storage.usage(pid, 0, 2**62, "day")) == {
        "2024-10-04": (3, 602, 103, 20, 1621),
        "2024-10-05": (4, 4, 0, 0, 0),
    }
    assert sums(await storage.usage(pid, 0, 2**62, "key")) == {None: (7, 606, 103, 20, 1621)}


async def test_cache_savings_sum_past_64_bits_of_products(storage):
    """A billion cache reads at 9000 USD per MTok off save 9e18 micro-units x 10^6 each:
    two of them pass a 64-bit sum of products, never the sum in micro-units."""
    pid = await funded(storage, 10_000)
    for n in range(2):
        usage = priced(10**9, 9_000_000_000, 0)
        await settle(storage, pid, None, n, usage=usage, at=n)
    [row] = await storage.usage(pid, 0, 2**62, "model")
    assert row["cache_savings"] == 2 * 9 * 10**12


async def test_payments_and_purchases_are_credited_once(storage):
    pid = await funded(storage, 0)
    payment = PaymentRecord(
        id=new_id("pay"), project_id=pid, reference="INV-1", amount=500, month=MONTH
    )
    assert await storage.record_payment(payment) == payment
    with pytest.raises(StateConflict):
        await storage.record_payment(
            PaymentRecord(
                id=new_id("pay"), project_id=pid, reference="INV-1", amount=9, month=MONTH
            )
        )
    with pytest.raises(RecordNotFound):
        await storage.record_payment(
            PaymentRecord(
                id=new_id("pay"), project_id="prj_missing", reference="X", amount=9, month=MONTH
            )
        )
    tx = "0x" + "ab" * 32
    purchase = PurchaseRecord(
        tx_hash=tx,
        project_id=pid,
        sender="0x" + "11" * 20,
        token_units=2**70,
        amount=300,
        month=MONTH,
        created_at=3,
    )
    assert await storage.get_purchase(tx) is None
    assert await storage.record_purchase(purchase) == purchase
    assert await storage.get_purchase(tx) == purchase
    with pytest.raises(StateConflict):
        await storage.record_purchase(purchase)
    assert (await storage.project_account(pid, MONTH)).balance == 800
    ledger = await storage.list_ledger(pid, 10, None)
    assert [(e.kind, e.amount, e.reference) for e in ledger] == [
        ("purchase", 300, tx),
        ("payment", 500, "INV-1"),
    ]
    audit = await storage.audit(pid, MONTH)
    assert audit.balance == audit.ledger_sum == 800


async def test_concurrent_duplicate_payments_credit_once(fresh_storage_url):
    handles = [await open_storage(fresh_storage_url) for _ in range(3)]
    try:
        pid = await funded(handles[0], 0)
        outcomes = await asyncio.gather(
            *(
                h.record_payment(
                    PaymentRecord(
                        id=new_id("pay"), project_id=pid, reference="R", amount=50, month=MONTH
                    )
                )
                for h in handles
            ),
            return_exceptions=True,
        )
        assert sum(isinstance(o, PaymentRecord) for o in outcomes) == 1
        assert all(isinstance(o, PaymentRecord | StateConflict) for o in outcomes)
        assert (await handles[0].project_account(pid, MONTH)).balance == 50
    finally:
        for handle in handles:
            await handle.close()


async def test_payer_addresses_and_sandboxes(storage):
    pid = await funded(storage, 0)
    await storage.set_payer_addresses(pid, ["0xbb", "0xaa", "0xaa"])
    assert await storage.payer_addresses(pid) == ["0xaa", "0xbb"]
    await storage.set_payer_addresses(pid, ["0xcc"])
    assert await storage.payer_addresses(pid) == ["0xcc"]
    with pytest.raises(RecordNotFound):
        await storage.set_payer_addresses("prj_missing", [])
    sandboxes = [
        await storage.create_sandbox(
            SandboxRecord(
                id=new_id("sbx"),
                project_id=pid,
                runtime="bash",
                timeout_s=1,
                memory_mb=1,
                created_at=4,
            )
        )
        for _ in range(2)
    ]
    assert await storage.list_sandboxes(pid) == sandboxes[::-1]
    await storage.archive_project(pid)
    with pytest.raises(StateConflict):
        await storage.set_payer_addresses(pid, [])


async def test_limit_figures(storage):
    pid = await funded(storage, 1_000)
    await storage.update_project(pid, {"monthly_budget": 900})
    k = await storage.create_key(
        KeyRecord(
            id=new_id("key"),
            prefix="proj_live_lf" + new_id("x"),
            key_hash=b"h",
            project_id=pid,
            scopes=frozenset({"inference"}),
            monthly_limit=400,
        )
    )
    await settle(storage, pid, k.id, 0)
    assert await storage.limit_figures(pid, k.id, MONTH) == {
        "balance": 990,
        "reserved": 0,
        "monthly_budget": 900,
        "month_spend": 10,
        "key_monthly_limit": 400,
        "key_reserved": 0,
        "key_month_spend": 10,
    }
    figures = await storage.limit_figures(pid, None, MONTH)
    assert (figures["key_monthly_limit"], figures["key_month_spend"]) == (None, 0)
    with pytest.raises(RecordNotFound):
        await storage.limit_figures("prj_missing", None, MONTH)
