"""The sandbox node: a small HTTP service that runs untrusted code for the gateway.

    GET  /healthz   what isolation the host allows, and whether the node will execute
    POST /execute   signed JSON job -> signed JSON result (see `ExecuteRequest`, `Result`)
    POST /stop      signed {"execution_id"} -> signed {"execution_id", "state"}

A running execution ends early, with status `cancelled` and the time it ran, when the
gateway asks `/stop` for it or when the connection that carries it closes (the gateway
died or gave up). `/stop` for an execution the node has not received yet is remembered
for the signature window, so that a stop overtaking its own job still wins.

Every answer is signed and bound to its request's nonce (gateway/sandbox/wire_auth.py),
errors included, as long as the request carried a well-formed nonce: the gateway can
then tell the node's own refusals from a forgery. Errors are `{"error": {"type",
"message"}}`: 401 `unauthorized`, 413 `too_large`, 400 `invalid_request`, 409 `conflict`
(an execution id already running), 503 `busy` (with retry-after), 500
`sandbox_unavailable` (isolation missing: the node refuses) and 500 `sandbox_failure`.
"""

import asyncio
import logging
import math
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Annotated, Literal

import msgspec
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from model_gateway.gateway.sandbox.node.isolation import (
    IsolationError,
    Job,
    Sandbox,
    SandboxBusy,
    SandboxUnavailable,
)
from model_gateway.gateway.sandbox.node.process import StopSignal
from model_gateway.gateway.sandbox.wire_auth import (
    NONCE_HEADER,
    RETRY_AFTER_HEADER,
    SignatureError,
    Signer,
    load_shared_secret,
    well_formed_nonce,
)

logger = logging.getLogger("gateway.sandbox.node")

MAX_CODE_BYTES = 100 * 1024
MAX_STDIN_BYTES = 256 * 1024
# JSON's worst escaping is 6 bytes per byte (a control character as \u001f); the rest of
# the job (runtime, id, limits, keys) fits in far less than the margin.
MAX_BODY_BYTES = 6 * (MAX_CODE_BYTES + MAX_STDIN_BYTES) + 64 * 1024
BUSY_RETRY_AFTER_S = "5"
EARLY_STOP_TTL_S = 120.0  # beyond the signature window: a job this late is refused anyway
MAX_EARLY_STOPS = 10_000


class ExecuteRequest(msgspec.Struct, forbid_unknown_fields=True):
    runtime: Literal["python", "node", "bash"]
    code: str
    execution_id: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    stdin: str = ""
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=300)] = 10.0
    memory_mb: Annotated[int, msgspec.Meta(ge=32, le=4096)] = 128

    def __post_init__(self) -> None:
        if len(self.code.encode()) > MAX_CODE_BYTES:
            raise ValueError("code is larger than 100 KiB")
        if len(self.stdin.encode()) > MAX_STDIN_BYTES:
            raise ValueError("stdin is larger than 256 KiB")


class StopRequest(msgspec.Struct, forbid_unknown_fields=True):
    execution_id: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


_decode_job = msgspec.json.Decoder(ExecuteRequest).decode
_decode_stop = msgspec.json.Decoder(StopRequest).decode


class Executions:
    """The stop signals of running executions, and stops that arrived before their job."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.running: dict[str, StopSignal] = {}
        self._early: OrderedDict[str, float] = OrderedDict()  # id -> expiry, in arrival order
        self._clock = clock

    def stop(self, execution_id: str) -> str:
        """Stops it if it runs; else remembers the stop for a job still on its way."""
        signal = self.running.get(execution_id)
        if signal is not None:
            signal.request()
            return "stopping"
        self._forget_expired()
        if len(self._early) >= MAX_EARLY_STOPS:
            self._early.popitem(last=False)
        self._early[execution_id] = self._clock() + EARLY_STOP_TTL_S
        return "not_running"

    def start(self, execution_id: str) -> StopSignal | None:
        """A new run's stop signal (already set if its stop came first); None if it runs."""
        if execution_id in self.running:
            return None
        signal = self.running[execution_id] = StopSignal()
        if self._early.pop(execution_id, None) is not None:
            signal.request()
        return signal

    def finish(self, execution_id: str) -> None:
        self.running.pop(execution_id).close()

    def _forget_expired(self) -> None:
        now = self._clock()
        while self._early and next(iter(self._early.values())) <= now:
            self._early.popitem(last=False)


class Replier:
    """Signed answers to one request: bound to its nonce whenever it carried a usable one."""

    def __init__(self, signer: Signer, request: Request) -> None:
        self._signer = signer
        nonce = request.headers.get(NONCE_HEADER, "")
        self._nonce = nonce if well_formed_nonce(nonce) else None

    def __call__(
        self, status: int, payload: object, headers: dict[str, str] | None = None
    ) -> Response:
        raw = orjson.dumps(payload)
        signed: dict[str, str] = {}
        if self._nonce:
            retry_after = str((headers or {}).get(RETRY_AFTER_HEADER, ""))
            signed = self._signer.sign_response(status, raw, self._nonce, retry_after)
        return Response(
            raw, status, headers={**signed, **(headers or {})}, media_type="application/json"
        )

    def error(
        self, status: int, kind: str, message: str, headers: dict[str, str] | None = None
    ) -> Response:
        return self(status, {"error": {"type": kind, "message": message}}, headers)


def create_node_app(
    secret: bytes, *, max_concurrent: int, allow_degraded: bool = False
) -> Starlette:
    """Probes the host (a few tens of milliseconds) and returns the node's ASGI app.

    Requests timestamped before the app was created are refused: a request captured from
    a previous run of the node cannot be replayed at this one, whose nonce memory is new.
    The app takes its first request at the next whole second (see `serve_node`).
    """
    signer = Signer(secret, not_before=math.ceil(time.time()))
    sandbox = Sandbox(max_concurrent=max_concurrent, allow_degraded=allow_degraded)
    executions = Executions()
    # The report as JSON, in the message (text format) and as a field (JSON format).
    report, fields = (
        orjson.dumps(sandbox.report).decode(),
        {"fields": {"isolation": sandbox.report}},
    )
    if sandbox.will_execute:
        logger.info("sandbox node ready: %s", report, extra=fields)
    else:
        logger.error("sandbox node will refuse to execute: %s", report, extra=fields)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "isolation": sandbox.report})

    async def verified(request: Request, reply: Replier) -> bytes | Response:
        """The body of a request whose signature verified, or the signed refusal."""
        body = await _read_capped(request)
        if body is None:
            return reply.error(413, "too_large", "request body too large")
        try:
            signer.verify_request(request.headers, f"{request.method} {request.url.path}", body)
        except SignatureError as exc:
            # Without uvicorn's access lines (see serve_node), a refusal is logged here.
            logger.warning("refused %s %s: %s", request.method, request.url.path, exc)
            return reply.error(401, "unauthorized", str(exc))
        return body

    async def execute(request: Request) -> Response:
        reply = Replier(signer, request)
        body = await verified(request, reply)
        if isinstance(body, Response):
            return body
        try:
            job = _decode_job(body)
        except msgspec.ValidationError as exc:
            return reply.error(400, "invalid_request", str(exc))
        except msgspec.DecodeError:
            return reply.error(400, "invalid_request", "body is not valid JSON")
        stop = executions.start(job.execution_id)
        if stop is None:
            return reply.error(409, "conflict", f"execution {job.execution_id} is running")
        try:
            return await _run(sandbox, job, stop, request, reply)
        finally:
            executions.finish(job.execution_id)

    async def stop(request: Request) -> Response:
        reply = Replier(signer, request)
        body = await verified(request, reply)
        if isinstance(body, Response):
            return body
        try:
            wanted = _decode_stop(body)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return reply.error(400, "invalid_request", str(exc))
        state = executions.stop(wanted.execution_id)
        logger.info("stop %s: %s", wanted.execution_id, state)
        return reply(200, {"execution_id": wanted.execution_id, "state": state})

    app = Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/execute", execute, methods=["POST"]),
            Route("/stop", stop, methods=["POST"]),
        ]
    )
    app.state.not_before = signer.not_before
    return app


async def _run(
    sandbox: Sandbox, job: ExecuteRequest, stop: StopSignal, request: Request, reply: Replier
) -> Response:
    """Runs the job, stopping it if the gateway's connection closes first."""
    watch = asyncio.ensure_future(_stop_on_disconnect(request, stop))
    try:
        result = await sandbox.execute(
            Job(job.runtime, job.code, job.stdin, job.timeout_s, job.memory_mb), stop
        )
    except SandboxBusy as exc:
        return reply.error(503, "busy", str(exc), {RETRY_AFTER_HEADER: BUSY_RETRY_AFTER_S})
    except SandboxUnavailable as exc:
        return reply.error(500, "sandbox_unavailable", str(exc))
    except (IsolationError, OSError) as exc:
        logger.exception("execution %s could not run", job.execution_id)
        return reply.error(500, "sandbox_failure", type(exc).__name__)
    finally:
        watch.cancel()
    logger.info(
        "execution %s runtime=%s status=%s duration_ms=%d",
        job.execution_id, job.runtime, result.status, result.duration_ms,
    )  # fmt: skip
    return reply(200, {"execution_id": job.execution_id, **result.to_dict()})


async def _stop_on_disconnect(request: Request, stop: StopSignal) -> None:
    # The body is read: the next message is the disconnect, whenever it comes.
    while (await request.receive())["type"] != "http.disconnect":
        pass
    stop.request()


async def serve_node(
    host: str,
    port: int,
    secret_file: str | os.PathLike[str],
    *,
    max_concurrent: int = 4,
    allow_degraded: bool = False,
    log_level: str = "info",
    fd: int | None = None,
) -> None:
    """Runs the node under uvicorn until SIGINT/SIGTERM (for `gateway sandbox-node`).

    `secret_file` is created (0600) if missing; the gateway must read the same file.
    Run it as root: each slot drops to its own uid (20000 + slot). `fd` is a listening
    socket already bound by the caller (a spawning gateway); else it binds host:port.
    """
    secret = load_shared_secret(secret_file)
    app = create_node_app(secret, max_concurrent=max_concurrent, allow_degraded=allow_degraded)
    # Requests signed in the second this node started are refused (they could predate
    # it): wait for the next second so that the gateway's first request is not one.
    await asyncio.sleep(max(0.0, app.state.not_before - time.time()))
    # uvicorn's loggers propagate to the process's own handler (gateway.logs: the
    # deployment's log_format). No access lines: the gateway's health check comes every
    # 2 s, and runs, stops and refusals are logged by the node itself.
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        log_config=None,
        access_log=False,
        lifespan="off",
    )
    sockets = None if fd is None else [socket.socket(fileno=fd)]
    await uvicorn.Server(config).serve(sockets=sockets)


async def _read_capped(request: Request) -> bytes | None:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            return None
    return bytes(body)
