"""The gateway's side of the node protocol: one signed call, one verified answer."""

import aiohttp
import orjson

from gateway.sandbox.signing import NONCE_HEADER, SignatureError, Signer

# Beyond the job's own timeout: bwrap start-up, clean-up and the HTTP round trip.
TIMEOUT_MARGIN_S = 10.0


class NodeError(Exception):
    """The node failed, or its answer did not verify: the gateway's 502 `sandbox_error`."""


class NodeBusy(NodeError):
    """Every slot of the node is running: the gateway's 503 `service_unavailable`."""

    def __init__(self, message: str, retry_after: str) -> None:
        super().__init__(message)
        self.retry_after = retry_after


async def execute_on_node(
    session: aiohttp.ClientSession, base_url: str, signer: Signer, job: dict[str, object]
) -> dict[str, object]:
    """POSTs `job` (the node's ExecuteRequest fields) and returns the verified result object."""
    body = orjson.dumps(job)
    headers = signer.sign_request(body)
    timeout = aiohttp.ClientTimeout(total=float(job.get("timeout_s", 10.0)) + TIMEOUT_MARGIN_S)
    try:
        async with session.post(
            f"{base_url.rstrip('/')}/execute",
            data=body,
            headers={**headers, "content-type": "application/json"},
            timeout=timeout,
        ) as response:
            raw = await response.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise NodeError(f"sandbox node unreachable: {type(exc).__name__}") from exc
    try:
        signer.verify_response(response.headers, raw, headers[NONCE_HEADER])
        payload = orjson.loads(raw)
    except (SignatureError, orjson.JSONDecodeError) as exc:
        raise NodeError(f"sandbox node answer rejected (HTTP {response.status}): {exc}") from exc
    if response.status == 200:
        return payload
    error = payload.get("error", {}) if isinstance(payload, dict) else {}
    message = f"sandbox node: {error.get('type', 'error')}: {error.get('message', '')}"
    if response.status == 503 and error.get("type") == "busy":
        raise NodeBusy(message, response.headers.get("retry-after", "5"))
    raise NodeError(message)
