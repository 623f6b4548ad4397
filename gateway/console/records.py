"""Console writes that the CLI also makes: one implementation, so both write the same records.

Projects, keys and sandboxes are created by the CLI's own functions (gateway/cli.py);
payments by `record_payment`, which the CLI's `payments record` calls as well.
"""

from __future__ import annotations

from types import SimpleNamespace

from model_gateway.gateway import cli
from model_gateway.gateway.metering import current_month
from model_gateway.storage.base import PaymentRecord, Storage, new_id, now_s


def _csv(values: list[str] | None) -> str | None:
    return None if values is None else ",".join(values)


async def create_project(config, storage: Storage, *, name: str, **options) -> dict:
    args = SimpleNamespace(
        name=name,
        budget=options.get("monthly_budget"),
        balance=None,  # money comes in as a payment (or development credit), not here
        rpm=options.get("rpm"),
        allow_models=_csv(options.get("allow_models")),
        exclude_models=_csv(options.get("exclude_models")),
    )
    return await cli.projects_create(args, config, storage)


async def create_key(config, storage: Storage, project_id: str, scopes, **options) -> dict:
    args = SimpleNamespace(
        project=project_id,
        scopes=",".join(sorted(scopes)),
        models=_csv(options.get("models")),
        monthly_limit=options.get("monthly_limit"),
        expires_at=options.get("expires_at"),
        rpm=options.get("rpm"),
    )
    return await cli.keys_create(args, config, storage)


async def create_sandbox(config, storage: Storage, project_id: str, runtime: str, **limits):
    args = SimpleNamespace(project=project_id, runtime=runtime, **limits)
    return await cli.sandboxes_create(args, config, storage)


async def record_payment(
    storage: Storage, project_id: str, amount: int, reference: str, recorded_by: str | None
) -> PaymentRecord:
    """Credit money that arrived by other means, once per reference (StateConflict)."""
    payment = PaymentRecord(
        id=new_id("pay"),
        project_id=project_id,
        reference=reference,
        amount=amount,
        month=current_month(),
        recorded_by=recorded_by,
        created_at=now_s(),
    )
    return await storage.record_payment(payment)
