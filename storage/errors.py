"""The storage's errors: every failure a backend raises is a StorageError (driver errors
are translated into them once, by `Storage`, storage/base.py)."""

from __future__ import annotations


class StorageError(Exception):
    """A backend failure. Its message never reaches a client (it may hold SQL or paths)."""


class RecordNotFound(StorageError):
    pass


class StateConflict(StorageError):
    """The operation does not fit the record's current state (e.g. revoking a revoked key)."""


class AmountOverflow(StateConflict):
    """The write would take a balance or a sum past MAX_AMOUNT: nothing of it was written."""


class PayerAddressTaken(StateConflict):
    """Another project holds this payer address: an address belongs to at most one project
    of the deployment, so that a transfer from it is credited to that project alone."""

    def __init__(self, address: str) -> None:
        super().__init__(f"payer address {address} belongs to another project")
        self.address = address


class LimitReached(StorageError):
    """A reservation was refused; `reason` is budget_exceeded or insufficient_balance."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
