"""The audit entry of each change (decisions.md, Operators (wave 3)): who made it, what it
did to which record, and the console request it came in. The admin service builds one for
every change and hands it to the storage method that makes the change, which writes both
in one transaction (storage/ports.py, "Audited changes").

Who: the CLI's context names its OS user; the console's context is shared by its handlers,
so each console request names its signed-in user (or `anonymous`) and its request id for
the changes made while it is handled (`acting`, set by the console's dispatch). Sessions
and failed sign-ins are recorded by gateway/console/sessions.py and throttle.py, with
`entry`, under the request that signs in.

`changes` holds each changed field's new value as the console's JSON shows it: amounts as
decimal strings, times RFC 3339. Never a key, a password, a hash or a session id: the
builders here take only the fields they are given, and no change passes those."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar

from model_gateway.gateway.admin.admin_context import AdminContext
from model_gateway.gateway.admin.admin_views import iso
from model_gateway.gateway.metering.money import format_amount
from model_gateway.storage.base import AuditEntry, new_id, now_s

# The fields whose values are micro-units, and those that are unix seconds.
_AMOUNTS = frozenset({"amount", "monthly_budget", "monthly_limit"})
_TIMES = frozenset({"expires_at"})

# (actor, request id) of the console request being handled; None outside one.
_request: ContextVar[tuple[str, str] | None] = ContextVar("audit_request", default=None)


@contextlib.contextmanager
def acting(actor: str, request_id: str) -> Iterator[None]:
    """Within: the changes made are `actor`'s, in the request `request_id`."""
    token = _request.set((actor, request_id))
    try:
        yield
    finally:
        _request.reset(token)


def target(kind: str, record_id: str) -> dict[str, str]:
    return {"type": kind, "id": record_id}


def _shown(name: str, value: object) -> object:
    if value is None:
        return None
    if name in _AMOUNTS and isinstance(value, int):
        return format_amount(value)
    if name in _TIMES and isinstance(value, int):
        return iso(value)
    if isinstance(value, frozenset | set):
        return sorted(value)
    return value


def entry(
    actor: str, action: str, about: dict[str, str], changes: Mapping[str, object] | None = None
) -> AuditEntry:
    """An entry made by `actor`, under the console request being handled (if any)."""
    request = _request.get()
    return AuditEntry(
        id=new_id("aud"),
        at=now_s(),
        actor=actor,
        action=action,
        target=about,
        changes={name: _shown(name, value) for name, value in (changes or {}).items()},
        request_id=None if request is None else request[1],
    )


def audit_entry(
    admin: AdminContext,
    action: str,
    about: dict[str, str],
    changes: Mapping[str, object] | None = None,
) -> AuditEntry:
    """The entry of an admin change: by the console request's user, else the context's."""
    request = _request.get()
    return entry(admin.actor if request is None else request[0], action, about, changes)


def given(**fields: object) -> dict[str, object]:
    """The fields a new record was given: those set (not None, not empty)."""
    return {name: value for name, value in fields.items() if value is not None and value != []}
