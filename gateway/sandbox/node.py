"""The sandbox node: a small HTTP service that runs untrusted code for the gateway.

    GET  /healthz   what isolation the host allows, and whether the node will execute
    POST /execute   signed JSON job -> signed JSON result (see `ExecuteRequest`, `Result`)

Every answer to a request whose signature verified is signed and bound to it
(gateway/sandbox/signing.py). Errors are `{"error": {"type", "message"}}`:
401 `unauthorized`, 413 `too_large`, 400 `invalid_request`, 503 `busy` (with
retry-after), 500 `sandbox_unavailable` (isolation missing: the node refuses) and
500 `sandbox_failure`.
"""

import logging
import os
from typing import Annotated, Literal

import msgspec
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.sandbox.isolation import Job, Sandbox, SandboxBusy, SandboxError, SandboxUnavailable
from gateway.sandbox.signing import SignatureError, Signer, load_or_create_secret

logger = logging.getLogger("gateway.sandbox.node")

MAX_CODE_BYTES = 100 * 1024
MAX_STDIN_BYTES = 256 * 1024
MAX_BODY_BYTES = 1024 * 1024  # above code + stdin even when JSON escapes every character
BUSY_RETRY_AFTER_S = "5"


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


_decoder = msgspec.json.Decoder(ExecuteRequest)


def create_node_app(
    secret: bytes, *, max_concurrent: int, allow_degraded: bool = False
) -> Starlette:
    """Probes the host (a few tens of milliseconds) and returns the node's ASGI app."""
    signer = Signer(secret)
    sandbox = Sandbox(max_concurrent=max_concurrent, allow_degraded=allow_degraded)
    if sandbox.will_execute:
        logger.info("sandbox node ready: %s", sandbox.report)
    else:
        logger.error("sandbox node will refuse to execute: %s", sandbox.report)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "isolation": sandbox.report})

    async def execute(request: Request) -> Response:
        body = await _read_capped(request)
        if body is None:
            return _error(413, "too_large", "request body too large")
        try:
            nonce = signer.verify_request(request.headers, body)
        except SignatureError as exc:
            return _error(401, "unauthorized", str(exc))

        def reply(status: int, payload: object, headers: dict[str, str] | None = None) -> Response:
            raw = orjson.dumps(payload)
            signed = {**signer.sign_response(raw, nonce), **(headers or {})}
            return Response(raw, status, headers=signed, media_type="application/json")

        try:
            job = _decoder.decode(body)
        except msgspec.ValidationError as exc:
            return reply(400, _error_body("invalid_request", str(exc)))
        except msgspec.DecodeError:
            return reply(400, _error_body("invalid_request", "body is not valid JSON"))
        try:
            result = await sandbox.execute(
                Job(job.runtime, job.code, job.stdin, job.timeout_s, job.memory_mb)
            )
        except SandboxBusy as exc:
            return reply(503, _error_body("busy", str(exc)), {"retry-after": BUSY_RETRY_AFTER_S})
        except SandboxUnavailable as exc:
            return reply(500, _error_body("sandbox_unavailable", str(exc)))
        except (SandboxError, OSError) as exc:
            logger.exception("execution %s could not run", job.execution_id)
            return reply(500, _error_body("sandbox_failure", type(exc).__name__))
        logger.info(
            "execution %s runtime=%s status=%s duration_ms=%d",
            job.execution_id, job.runtime, result.status, result.duration_ms,
        )  # fmt: skip
        return reply(200, {"execution_id": job.execution_id, **result.to_dict()})

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/execute", execute, methods=["POST"]),
        ]
    )


async def serve_node(
    host: str,
    port: int,
    secret_file: str | os.PathLike[str],
    *,
    max_concurrent: int = 4,
    allow_degraded: bool = False,
    log_level: str = "info",
) -> None:
    """Runs the node under uvicorn until SIGINT/SIGTERM (for `gateway sandbox-node`).

    `secret_file` is created (0600) if missing; the gateway must read the same file.
    Run it as root: each slot drops to its own uid (20000 + slot).
    """
    secret = load_or_create_secret(secret_file)
    app = create_node_app(secret, max_concurrent=max_concurrent, allow_degraded=allow_degraded)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off")
    await uvicorn.Server(config).serve()


async def _read_capped(request: Request) -> bytes | None:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            return None
    return bytes(body)


def _error_body(kind: str, message: str) -> dict[str, dict[str, str]]:
    return {"error": {"type": kind, "message": message}}


def _error(status: int, kind: str, message: str) -> Response:
    return JSONResponse(_error_body(kind, message), status)
