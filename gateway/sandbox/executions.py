"""POST /v1/sandbox/executions: run a program on a sandbox node, billed by wall time.

Before anything is reserved, `admit` (run by the policy stage) checks that sandboxes are
configured (else 502 sandbox_error) and loads the sandbox record: the key's project's,
same runtime (404 not_found, 400 runtime). Its timeout fixes the hold. The handler then
takes a free slot on the healthy node with the most free slots (gateway.sandbox.pool) and
calls it. A node that never got the job (its connection failed) or refused it as busy
(another gateway instance's runs fill it) did not run it: the next node is tried. With
no free slot left on any healthy node: 503 service_unavailable, retry-after: 5. With no
healthy node at all: 502 sandbox_error, as for a node that cannot be reached. A job the
node may have started is never sent again (it may have had effects): a node that fails
then is a 502 sandbox_error, and is skipped by the next executions until it recovers.
Any error leaves `ctx.billing` None: the hold is released in full and no receipt issued.
A program that ran, whatever its exit, is billed: `completed` settles as `succeeded`,
`failed` and `timed_out` as `failed`.

A client that leaves mid-run cancels the handler (dispatch does). The node's run goes on
in its own task until the handler has asked the node to stop it and the node answered
with the time it ran: that time is billed as `cancelled`. The slot counts as taken until
the node's answer, so the gateway never admits more runs than the node has free slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec
import orjson
from starlette.responses import Response

from model_gateway.gateway.metering.pricing import SandboxPricing
from model_gateway.gateway.sandbox.client import NodeBusy, NodeError, NodeUnreachable
from model_gateway.gateway.sandbox.pool import NodePool, SandboxNode
from model_gateway.gateway.sandbox.runtimes import Runtime
from model_gateway.pipeline.context import Billing, Outcome
from model_gateway.pipeline.endpoint import Endpoint
from model_gateway.pipeline.errors import (
    JSON_CONTENT_TYPE,
    GatewayError,
    InvalidRequest,
    NotFound,
    SandboxError,
    ServiceUnavailable,
)
from model_gateway.pipeline.validation import decoder

if TYPE_CHECKING:
    from model_gateway.gateway.config import Config
    from model_gateway.pipeline.context import RequestContext
    from model_gateway.storage import AccountsPort, SandboxRecord

log = logging.getLogger("gateway.sandbox")

MAX_CODE_BYTES = 100 * 1024
MAX_STDIN_BYTES = 256 * 1024  # the node's own limit
CAPACITY_RETRY_AFTER_S = 5
# After a stop request: how long the node may take to kill the run and answer. Beyond it,
# the node's connection is closed, which stops the run on the node as well.
STOP_WAIT_S = 10.0
_JSON = JSON_CONTENT_TYPE.decode()


class ExecutionRequest(msgspec.Struct, forbid_unknown_fields=True):
    sandbox_id: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    runtime: Runtime
    code: str
    stdin: str = ""

    def check(self) -> None:
        if len(self.code.encode()) > MAX_CODE_BYTES:
            raise InvalidRequest("The code is larger than 100 KiB.", param="code")
        if len(self.stdin.encode()) > MAX_STDIN_BYTES:
            raise InvalidRequest("The stdin is larger than 256 KiB.", param="stdin")


@dataclass(slots=True)
class Execution:
    """`ctx.payload`: the request, and the sandbox once `admit` has read it."""

    request: ExecutionRequest
    sandbox: SandboxRecord | None = None

    @property
    def runtime(self) -> str:
        return self.request.runtime


_decode_request = decoder(ExecutionRequest)


def decode_execution(body: bytes) -> Execution:
    return Execution(_decode_request(body))


class NodeResult(msgspec.Struct):
    """The part of the node's answer the gateway relies on; anything else is malformed."""

    execution_id: str
    status: Literal["completed", "failed", "timed_out", "cancelled"]
    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: Annotated[int, msgspec.Meta(ge=0)]
    oom_killed: bool = False


class SandboxExecutions:
    """The endpoint, and its side of the nodes (gateway.sandbox.pool)."""

    def __init__(self, config: Config, storage: AccountsPort, pool: NodePool) -> None:
        self.storage = storage
        prices = config.sandbox_pricing
        self.pricing = SandboxPricing(prices.per_execution, prices.per_second)
        self.pool = pool
        self._started = False

    def routes(self) -> list[Endpoint]:
        return [
            Endpoint(
                "POST",
                "/v1/sandbox/executions",
                "sandboxes",
                self.execute,
                decode=decode_execution,
                admit=self.admit,
                pricing=self.pricing,
            )
        ]

    async def start(self) -> None:
        await self.pool.start()  # with spawn = true, NodeStartError: `gateway serve` fails
        self._started = True

    async def close(self) -> None:
        self._started = False
        await self.pool.close()

    async def admit(self, ctx: RequestContext) -> None:
        if not (self._started and self.pool.nodes):
            raise SandboxError("Sandboxes are not configured on this deployment.")
        execution: Execution = ctx.payload
        execution.sandbox = await self._sandbox_of(ctx, execution.request)

    async def execute(self, ctx: RequestContext) -> Response:
        execution: Execution = ctx.payload
        sandbox = execution.sandbox
        assert sandbox is not None  # read by admit, which runs first
        execution_id = "exe_" + secrets.token_hex(12)
        tried: set[SandboxNode] = set()
        while True:
            node = self._choose(tried)
            started = time.monotonic()
            # Its own task, so that cancelling this handler leaves the node's run to be
            # stopped and measured; the slot is freed when the node has answered, not before.
            node.in_use += 1
            call = asyncio.ensure_future(self._run(node, execution_id, execution.request, sandbox))
            call.add_done_callback(functools.partial(_free_slot, node))
            try:
                result = await asyncio.shield(call)
                break
            except _NotStarted:
                tried.add(node)
            except asyncio.CancelledError:
                await _despite_cancellation(self._abandon(ctx, node, execution_id, call, started))
                raise
        raw = self._answer(ctx, execution_id, result)
        ctx.billing = Billing(
            _OUTCOMES.get(result.status, "failed"),
            {"duration_ms": result.duration_ms},
            hashlib.sha256(raw).hexdigest(),
        )
        return Response(raw, media_type=_JSON)

    def _choose(self, tried: set[SandboxNode]) -> SandboxNode:
        node = self.pool.choose(tried)
        if node is not None:
            return node
        if self.pool.any_healthy():  # every healthy node is full (or said it is)
            raise ServiceUnavailable(
                "Sandbox capacity is temporarily exhausted.", retry_after=CAPACITY_RETRY_AFTER_S
            )
        raise SandboxError("No sandbox node is reachable.")

    async def _abandon(
        self,
        ctx: RequestContext,
        node: SandboxNode,
        execution_id: str,
        call: asyncio.Future[NodeResult],
        started: float,
    ) -> None:
        """The client left mid-run: stop the run on the node and bill the time it ran."""
        try:
            await node.stop(execution_id)
        except NodeError as exc:  # the connection's close below still stops it
            log.warning("execution %s: stop refused: %s", execution_id, exc)
        try:
            result = await asyncio.wait_for(asyncio.shield(call), STOP_WAIT_S)
        except (GatewayError, _NotStarted):
            return  # the node did not run it (busy, failed): nothing to bill
        except TimeoutError:
            # A node that does not answer a stop in time is presumed broken: closing the
            # connection stops the run there as soon as it notices, and frees our slot.
            # The time billed is our own measure, at most the sandbox's limit.
            call.cancel()
            ran_ms = int((time.monotonic() - started) * 1000)
            log.warning("execution %s: no answer to stop; billing %d ms", execution_id, ran_ms)
            result = NodeResult(execution_id, "cancelled", -1, "", "", False, False, ran_ms)
        raw = self._answer(ctx, execution_id, msgspec.structs.replace(result, status="cancelled"))
        ctx.billing = Billing(
            "cancelled", {"duration_ms": result.duration_ms}, hashlib.sha256(raw).hexdigest()
        )

    @staticmethod
    def _answer(ctx: RequestContext, execution_id: str, result: NodeResult) -> bytes:
        sandbox = ctx.payload.sandbox
        return orjson.dumps(
            {
                "id": execution_id,
                "object": "sandbox.execution",
                "sandbox_id": sandbox.id,
                "runtime": sandbox.runtime,
                "status": result.status,
                "exit_code": result.exit_code,
                "stdout": result.stdout,
                "stderr": result.stderr,
                "stdout_truncated": result.stdout_truncated,
                "stderr_truncated": result.stderr_truncated,
                "oom_killed": result.oom_killed,
                "duration_ms": result.duration_ms,
                "receipt_id": ctx.receipt_id,
            }
        )

    async def _sandbox_of(self, ctx: RequestContext, request: ExecutionRequest) -> SandboxRecord:
        project = ctx.project
        assert project is not None  # key auth ran
        sandbox = await self.storage.get_sandbox(request.sandbox_id)
        # Another project's sandbox is as absent as a missing one.
        if sandbox is None or sandbox.project_id != project.id:
            raise NotFound("No sandbox configuration with this ID exists.", param="sandbox_id")
        if sandbox.runtime != request.runtime:
            raise InvalidRequest(
                f"The sandbox runs {sandbox.runtime}, not {request.runtime}.", param="runtime"
            )
        return sandbox

    async def _run(
        self,
        node: SandboxNode,
        execution_id: str,
        request: ExecutionRequest,
        sandbox: SandboxRecord,
    ) -> NodeResult:
        job = {
            "runtime": sandbox.runtime,
            "code": request.code,
            "stdin": request.stdin,
            "execution_id": execution_id,
            "timeout_s": sandbox.timeout_s,
            "memory_mb": sandbox.memory_mb,
        }
        try:
            answer = await node.execute(job)
        except NodeBusy:
            raise _NotStarted() from None
        except NodeUnreachable as exc:
            log.warning("execution %s on %s: %s", execution_id, node.name, exc)
            if not exc.sent:
                raise _NotStarted() from None
            raise SandboxError() from None
        except NodeError as exc:
            log.warning("execution %s on %s: %s", execution_id, node.name, exc)
            raise SandboxError() from None
        try:
            result = msgspec.convert(answer, NodeResult)
        except msgspec.ValidationError as exc:
            log.warning("execution %s: malformed node answer: %s", execution_id, exc)
            raise SandboxError() from None
        if result.execution_id != execution_id:
            log.warning("execution %s: the node answered for %s", execution_id, result.execution_id)
            raise SandboxError()
        return result


class _NotStarted(Exception):
    """The node did not run the job (its connection failed, or it was busy): try another."""


def _free_slot(node: SandboxNode, call: asyncio.Future[NodeResult]) -> None:
    node.in_use -= 1
    if not call.cancelled():
        call.exception()  # retrieved: an abandoned call's error is not "never retrieved"


# The program ran, whatever its exit: billed either way, the receipt says how it went.
_OUTCOMES: dict[str, Outcome] = {"completed": "succeeded", "cancelled": "cancelled"}


async def _despite_cancellation(work: Awaitable[None]) -> None:
    """Runs `work` to its end even if the caller is cancelled again meanwhile (it must be
    bounded on its own); the caller re-raises its cancellation afterwards."""
    task = asyncio.ensure_future(work)
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)
    task.result()
