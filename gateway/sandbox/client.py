"""The gateway's side of the node protocol: signed calls, verified answers."""

from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from model_gateway.gateway.sandbox.wire_auth import NONCE_HEADER, SignatureError, Signer

# Beyond the job's own timeout: bwrap start-up, clean-up and the HTTP round trip.
TIMEOUT_MARGIN_S = 10.0
STOP_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 3.0  # a node that does not accept a connection by then is down


class NodeError(Exception):
    """The node failed, or its answer did not verify: the gateway's 502 `sandbox_error`."""


class NodeUnreachable(NodeError):
    """No answer: the connection failed, broke or timed out. `sent` is False when it failed
    before the node could have received the job (safe to send the job elsewhere)."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class NodeBusy(NodeError):
    """Every slot of the node is running (another gateway instance's runs, perhaps): the job
    did not start there and may go to another node."""

    def __init__(self, message: str, retry_after: str) -> None:
        super().__init__(message)
        self.retry_after = retry_after


async def execute_on_node(
    session: aiohttp.ClientSession, base_url: str, signer: Signer, job: dict[str, Any]
) -> dict[str, object]:
    """POSTs `job` (the node's ExecuteRequest fields) and returns the verified result object."""
    timeout = float(job.get("timeout_s", 10.0)) + TIMEOUT_MARGIN_S
    return await _call(session, f"{base_url.rstrip('/')}/execute", signer, job, timeout)


async def stop_on_node(
    session: aiohttp.ClientSession, base_url: str, signer: Signer, execution_id: str
) -> str:
    """Asks the node to stop a run; returns its state (`stopping` or `not_running`)."""
    url = f"{base_url.rstrip('/')}/stop"
    answer = await _call(session, url, signer, {"execution_id": execution_id}, STOP_TIMEOUT_S)
    return str(answer.get("state"))


async def node_healthy(
    session: aiohttp.ClientSession, base_url: str, timeout_s: float
) -> str | None:
    """GET /healthz: None when the node answers 200 and will execute, else why not."""
    url = f"{base_url.rstrip('/')}/healthz"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            raw = await response.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"unreachable: {type(exc).__name__}"
    if response.status != 200:
        return f"/healthz answered HTTP {response.status}"
    try:
        isolation = orjson.loads(raw)["isolation"]
        will_execute = isolation["will_execute"] is True
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return "/healthz answer is malformed"
    return None if will_execute else "the node refuses to execute (isolation missing)"


async def _call(
    session: aiohttp.ClientSession,
    url: str,
    signer: Signer,
    payload: dict[str, object],
    timeout_s: float,
) -> dict[str, object]:
    body = orjson.dumps(payload)
    headers = signer.sign_request(f"POST {urlsplit(url).path}", body)
    try:
        async with session.post(
            url,
            data=body,
            headers={**headers, "content-type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=CONNECT_TIMEOUT_S),
        ) as response:
            raw = await response.read()
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
        message = f"sandbox node unreachable: {type(exc).__name__}"
        raise NodeUnreachable(message, sent=False) from exc
    except (aiohttp.ClientError, TimeoutError) as exc:
        message = f"sandbox node unreachable: {type(exc).__name__}"
        raise NodeUnreachable(message, sent=True) from exc
    try:
        signer.verify_response(response.headers, response.status, raw, headers[NONCE_HEADER])
        answer = orjson.loads(raw)
    except (SignatureError, orjson.JSONDecodeError) as exc:
        raise NodeError(f"sandbox node answer rejected (HTTP {response.status}): {exc}") from exc
    if response.status == 200 and isinstance(answer, dict):
        return answer
    error = answer.get("error", {}) if isinstance(answer, dict) else {}
    message = f"sandbox node: {error.get('type', 'error')}: {error.get('message', '')}"
    if response.status == 503 and error.get("type") == "busy":
        raise NodeBusy(message, response.headers.get("retry-after", "5"))
    raise NodeError(message)
