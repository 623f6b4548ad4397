"""POST /v1/sandbox/executions: run a program on the sandbox node, billed by wall time.

Before anything is reserved, `admit` (run by the policy stage) checks that sandboxes are
configured (else 502 sandbox_error) and loads the sandbox record: the key's project's,
same runtime (404 not_found, 400 runtime). Its timeout fixes the hold. The handler then
takes a free slot among `max_concurrent` (else 503 service_unavailable, retry-after: 5)
and calls the node (502 sandbox_error; the node's own "busy" is a 503 too).
Any error leaves `ctx.outcome` None: the hold is released in full and no receipt issued.
A program that ran, whatever its exit, is billed: `completed` settles as `succeeded`,
`failed` and `timed_out` as `failed`.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

import aiohttp
import msgspec
import orjson
from starlette.responses import Response

from gateway.errors import (
    JSON_CONTENT_TYPE,
    InvalidRequest,
    NotFound,
    SandboxError,
    ServiceUnavailable,
)
from gateway.pricing import SandboxPricing
from gateway.routes import Endpoint
from gateway.sandbox.client import NodeBusy, NodeError, execute_on_node
from gateway.sandbox.signing import Signer, load_or_create_secret
from gateway.sandbox.supervisor import NodeSupervisor
from gateway.validation import decoder

if TYPE_CHECKING:
    from pipeline.context import RequestContext
    from storage import SandboxRecord

log = logging.getLogger("gateway.sandbox")

MAX_CODE_BYTES = 100 * 1024
MAX_STDIN_BYTES = 256 * 1024  # the node's own limit
CAPACITY_RETRY_AFTER_S = 5
_JSON = JSON_CONTENT_TYPE.decode()

Runtime = Literal["python", "node", "bash"]


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
    status: Literal["completed", "failed", "timed_out"]
    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: Annotated[int, msgspec.Meta(ge=0)]
    oom_killed: bool = False


class SandboxExecutions:
    """The endpoint, and its side of the node: one pooled session, a slot count, and
    (with `spawn = true`) the supervisor of a local node."""

    def __init__(self, gateway) -> None:
        self.gateway = gateway
        config = gateway.config
        self.node = config.sandbox_node
        prices = config.sandbox_pricing
        self.pricing = SandboxPricing(prices.per_execution, prices.per_second)
        self.in_flight = 0
        self._session: aiohttp.ClientSession | None = None
        self._signer: Signer | None = None
        self._supervisor: NodeSupervisor | None = None

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
        if self.node is None:
            return
        secret_file = self.gateway.config.path(self.node.secret_file)
        self._signer = Signer(load_or_create_secret(secret_file))
        # Two spare connections: a slot's connection may still be closing when it is reused.
        connector = aiohttp.TCPConnector(limit=self.node.max_concurrent + 2)
        self._session = aiohttp.ClientSession(connector=connector)
        if self.node.spawn:
            self._supervisor = NodeSupervisor(
                self.node.url, secret_file, max_concurrent=self.node.max_concurrent
            )
            await self._supervisor.start()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._supervisor is not None:
            await self._supervisor.stop()
            self._supervisor = None

    async def admit(self, ctx: RequestContext) -> None:
        if self._session is None:
            raise SandboxError("Sandboxes are not configured on this deployment.")
        execution: Execution = ctx.payload
        execution.sandbox = await self._sandbox_of(ctx, execution.request)

    async def execute(self, ctx: RequestContext) -> Response:
        execution: Execution = ctx.payload
        sandbox = execution.sandbox
        if self.in_flight >= self.node.max_concurrent:
            raise ServiceUnavailable(
                "Sandbox capacity is temporarily exhausted.", retry_after=CAPACITY_RETRY_AFTER_S
            )
        self.in_flight += 1
        try:
            execution_id = "exe_" + secrets.token_hex(12)
            result = await self._run(execution_id, execution.request, sandbox)
        finally:
            self.in_flight -= 1
        body = {
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
        raw = orjson.dumps(body)
        ctx.usage = {"duration_ms": result.duration_ms}
        # The program ran, whatever its exit: billed either way, the receipt says how it went.
        ctx.outcome = "succeeded" if result.status == "completed" else "failed"
        ctx.response_sha256 = hashlib.sha256(raw).hexdigest()
        return Response(raw, media_type=_JSON)

    async def _sandbox_of(self, ctx: RequestContext, request: ExecutionRequest) -> SandboxRecord:
        sandbox = await self.gateway.storage.get_sandbox(request.sandbox_id)
        # Another project's sandbox is as absent as a missing one.
        if sandbox is None or sandbox.project_id != ctx.project.id:
            raise NotFound("No sandbox configuration with this ID exists.", param="sandbox_id")
        if sandbox.runtime != request.runtime:
            raise InvalidRequest(
                f"The sandbox runs {sandbox.runtime}, not {request.runtime}.", param="runtime"
            )
        return sandbox

    async def _run(
        self, execution_id: str, request: ExecutionRequest, sandbox: SandboxRecord
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
            answer = await execute_on_node(self._session, self.node.url, self._signer, job)
        except NodeBusy:
            raise ServiceUnavailable(
                "Sandbox capacity is temporarily exhausted.", retry_after=CAPACITY_RETRY_AFTER_S
            ) from None
        except NodeError as exc:
            log.warning("execution %s: %s", execution_id, exc)
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
