"""The spec's error table as one exception hierarchy, and the one renderer of error bodies."""

from __future__ import annotations

from typing import ClassVar

import orjson
from starlette.types import Send

JSON_CONTENT_TYPE = b"application/json; charset=utf-8"


class GatewayError(Exception):
    type: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500
    default_message: ClassVar[str] = (
        "The request could not be completed because of an internal error."
    )

    def __init__(
        self,
        message: str | None = None,
        *,
        param: str | None = None,
        retry_after: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.message = message or self.default_message
        self.param = param
        self.retry_after = retry_after
        self.headers = headers or {}
        super().__init__(self.message)

    def body(self, request_id: str | None) -> dict[str, dict[str, object]]:
        error: dict[str, object] = {
            "type": self.type,
            "message": self.message,
            "request_id": request_id,
        }
        if self.param is not None:
            error["param"] = self.param
        if self.retry_after is not None:
            error["retry_after_seconds"] = self.retry_after
        return {"error": error}

    def response_headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"content-type", JSON_CONTENT_TYPE)]
        if self.retry_after is not None:
            headers.append((b"retry-after", str(self.retry_after).encode()))
        headers.extend((k.encode(), v.encode()) for k, v in self.headers.items())
        return headers


class InvalidRequest(GatewayError):
    type, status = "invalid_request", 400
    default_message = "The request is invalid."


class InvalidApiKey(GatewayError):
    type, status = "invalid_api_key", 401
    # One message for missing, malformed, unknown, revoked and expired keys: never say which.
    default_message = "The API key is missing or invalid."


class Unauthenticated(GatewayError):
    type, status = "unauthenticated", 401
    default_message = "Sign in to use the console."


class BudgetExceeded(GatewayError):
    type, status = "budget_exceeded", 402
    default_message = "The request would exceed a monthly limit or budget."


class InsufficientBalance(GatewayError):
    type, status = "insufficient_balance", 402
    default_message = "The project's available balance is too low for this request."


class Forbidden(GatewayError):
    type, status = "forbidden", 403
    default_message = "This operation is not permitted."


class InsufficientScope(GatewayError):
    type, status = "insufficient_scope", 403
    default_message = "The API key lacks the scope this endpoint requires."


class ModelNotAllowed(GatewayError):
    type, status = "model_not_allowed", 403
    default_message = "The model is not allowed for this key or project."


class ModelNotFound(GatewayError):
    type, status = "model_not_found", 404
    default_message = "No model with this ID exists."


class NotFound(GatewayError):
    type, status = "not_found", 404
    default_message = "The resource does not exist."


class MethodNotAllowed(GatewayError):
    type, status = "method_not_allowed", 405
    default_message = "The method is not allowed on this path."


class Conflict(GatewayError):
    type, status = "conflict", 409
    default_message = "The operation conflicts with the current state of the resource."


class RateLimitExceeded(GatewayError):
    type, status = "rate_limit_exceeded", 429
    default_message = "Too many requests per minute."


class InternalError(GatewayError):
    pass


class ProviderError(GatewayError):
    type, status = "provider_error", 502
    default_message = "The upstream provider failed or could not be reached."


class SandboxError(GatewayError):
    type, status = "sandbox_error", 502
    default_message = "The sandbox node failed or could not be reached."


class ServiceUnavailable(GatewayError):
    type, status = "service_unavailable", 503
    default_message = "The service is temporarily unavailable."


class ProviderTimeout(GatewayError):
    type, status = "provider_timeout", 504
    default_message = "The upstream provider did not respond in time."


def error_payload(error: GatewayError, request_id: str | None) -> bytes:
    return orjson.dumps(error.body(request_id))


async def send_error(send: Send, error: GatewayError, request_id: str | None) -> None:
    """Write a whole error response through `send` (so outer stages still add their headers)."""
    body = error_payload(error, request_id)
    headers = error.response_headers()
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
