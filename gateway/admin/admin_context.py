"""What every admin change runs with: the storage, the few settings changes depend on and
who makes it (the actor its audit entry names), the errors a change refuses with, and the
confirmation of changes the instances cache."""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from model_gateway.gateway.cluster.admin_confirm import Confirmation, confirm_admin_change
from model_gateway.gateway.ops.secretfile import load_or_create_secret
from model_gateway.storage import Storage

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class InvalidChange(Exception):
    """A change refused for its input: `param` (a field, e.g. "timeout_s") and why. The
    message is "<param> <reason>" (the console's); the CLI names the flag instead."""

    def __init__(self, reason: str, param: str | None = None) -> None:
        super().__init__(reason if param is None else f"{param} {reason}")
        self.reason = reason
        self.param = param


# The most tokens per minute a limit may be: storage's INTEGER column, and well within the
# whole numbers every rate limiter computes exactly (pipeline/gcra.py).
MAX_TPM = 2**31 - 1


def check_tpm(tpm: object) -> None:
    """A tokens-per-minute limit is unset or a whole number in 1..MAX_TPM (InvalidChange
    naming `tpm` otherwise)."""
    if tpm is not None and (type(tpm) is not int or not 0 < tpm <= MAX_TPM):
        raise InvalidChange(f"must be a positive integer, at most {MAX_TPM}", "tpm")


class NotPermitted(Exception):
    """A change this deployment does not allow (development credit in production)."""


# Who acts where no one is signed in: a sign-in that failed (decisions.md, wave 3).
ANONYMOUS = "anonymous"


def cli_actor() -> str:
    """The CLI's actor: "cli:<the OS user running it>" (its uid when it has no name)."""
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):  # no LOGNAME/USER and no passwd entry (a bare container)
        return f"cli:uid {os.getuid()}"


def user_actor(email: str) -> str:
    """A console user's actor: "user:<email>"."""
    return f"user:{email}"


@dataclass(frozen=True, kw_only=True)
class AdminContext:
    storage: Storage
    production: bool  # [server] environment = "production": no development credit
    key_pepper_file: Path  # [secrets] key_pepper_file, resolved: keys' HMAC pepper
    lease_s: float  # [cluster] lease_s: a confirmation waits at most 1.5 leases
    month: Callable[[], str]  # the current UTC month, "YYYY-MM" (gateway.metering)
    # Who makes the changes, named in their audit entries: cli_actor() for the CLI; the
    # console's context, shared by its handlers, has ANONYMOUS, and each of its requests
    # names its signed-in user instead (audit_trail.acting).
    actor: str

    def pepper(self) -> bytes:
        """The keys' pepper, created on first use (0600)."""
        return load_or_create_secret(self.key_pepper_file)


class _Server(Protocol):
    @property
    def environment(self) -> str: ...


class _Secrets(Protocol):
    @property
    def key_pepper_file(self) -> str: ...


class _Cluster(Protocol):
    @property
    def lease_s(self) -> float: ...


class DeploymentConfig(Protocol):
    """What the admin service reads of gateway.config.Config."""

    @property
    def server(self) -> _Server: ...

    @property
    def secrets(self) -> _Secrets: ...

    @property
    def cluster(self) -> _Cluster: ...

    def path(self, relative: str) -> Path: ...


def admin_context(
    storage: Storage, config: DeploymentConfig, month: Callable[[], str], actor: str
) -> AdminContext:
    """The context of a deployment's admin changes (the CLI's command, the console)."""
    return AdminContext(
        storage=storage,
        production=config.server.environment == "production",
        key_pepper_file=config.path(config.secrets.key_pepper_file),
        lease_s=config.cluster.lease_s,
        month=month,
        actor=actor,
    )


@dataclass(frozen=True)
class ConfirmedChange(Generic[R_co]):
    """A committed change and which live instances dropped it from their caches."""

    record: R_co
    confirmation: Confirmation


async def confirmed(admin: AdminContext, record: R) -> ConfirmedChange[R]:
    """The change, once every live instance acknowledged it (or its lease ended)."""
    return ConfirmedChange(record, await confirm_admin_change(admin.storage, admin.lease_s))
