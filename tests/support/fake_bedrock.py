"""A fake AWS Bedrock Runtime (Converse and ConverseStream), checking like AWS.

Every request's Signature V4 is recomputed with botocore from the secret the fake knows
for the access key in its Authorization header, over the path and body as received (so a
request signed over another path or other bytes than it sent fails, as at AWS): the
credential scope (date, region, service `bedrock`, aws4_request), `x-amz-date` within 5
minutes, `x-amz-content-sha256` when sent, and the session token of credentials that
have one. Refusals are AWS's: 403 with `x-amzn-errortype` (UnrecognizedClientException,
InvalidSignatureException, ...) and `{"message": ...}`. Bodies are checked as Converse
checks them (no unknown keys, alternating roles from user, tools only with toolConfig):
400 ValidationException.

Streams are AWS event-stream frames (`application/vnd.amazon.eventstream`), encoded
here. Behaviour by the model id in the path (see fake_upstream), any other id is
`normal`:

| model             | converse                         | converse-stream                 |
|-------------------|----------------------------------|---------------------------------|
| normal            | REPLY, end_turn                  | REPLY piece by piece            |
| tool-call         | calls the first tool (Paris); a  | the same, streamed              |
|                   | tool result: "The tool said: …"  |                                 |
| length            | stops early, max_tokens          | the same                        |
| cached            | 4 cache reads, 2 cache writes in | the same                        |
|                   | INPUT_TOKENS; a reasoning block  |                                 |
| fault-NNN         | NNN, SECRET in the body          | the same                        |
| cut-mid-stream    | half the body, then cut          | three text events, then cut     |
| stream-exception  | normal                           | two text events, then an        |
|                   |                                  | exception frame (throttling)    |
| bad-crc           | normal                           | a text frame whose CRC fails    |
| malformed-shape   | content is a string              | a text delta is a string        |
| no-metadata       | normal                           | ends after messageStop          |
| usage-* (broken)  | every usage count broken         | the same                        |
| slow, redirect... | as fake_upstream's before_answer | the same                        |
"""

from __future__ import annotations

import asyncio
import binascii
import hashlib
import hmac
import itertools
import re
import struct
import time
from datetime import UTC, datetime

import orjson
from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.support.fake_upstream import (
    BROKEN_COUNTS,
    INPUT_TOKENS,
    MALFORMED,
    OUTPUT_TOKENS,
    REPLY_PIECES,
    SECRET,
    FakeUpstream,
)

REGION = "us-east-1"
ACCESS_KEY, SECRET_KEY = "AKIAFAKEBEDROCK00001", "fake/bedrock/secret/key/4f0c9e2a"
# Temporary credentials: a key that is valid only with its session token.
TEMP_ACCESS_KEY, TEMP_SECRET_KEY = "ASIAFAKEBEDROCK00002", "fake/bedrock/temp/secret/77d1"
SESSION_TOKEN = "FwoGZXIvYXdzEFAKEsessiontoken/9a8b7c6d5e"
TOOL_INPUT_PARTS = ['{"city":', ' "Paris"}']
CACHE_READ, CACHE_WRITE = 4, 2  # within INPUT_TOKENS, in `cached` mode
REASONING = "Thinking it over."  # `cached` mode's reasoning block: never shown
MAX_SKEW_S = 300
EVENT_STREAM = "application/vnd.amazon.eventstream"

_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<credential>[^,\s]+),\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+),\s*Signature=(?P<signature>[0-9a-f]{64})"
)
_CONVERSE_KEYS = {
    "messages",
    "system",
    "inferenceConfig",
    "toolConfig",
    "guardrailConfig",
    "additionalModelRequestFields",
    "additionalModelResponseFieldPaths",
    "promptVariables",
    "requestMetadata",
    "performanceConfig",
}
_BLOCK_KEYS = {"text", "toolUse", "toolResult", "image", "document", "reasoningContent"}
_ERROR_TYPES = {
    400: "ValidationException",
    401: "UnrecognizedClientException",
    403: "AccessDeniedException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}


def _refusal(status: int, error_type: str, message: str) -> web.Response:
    return web.json_response(
        {"message": message}, status=status, headers={"x-amzn-errortype": error_type}
    )


def _invalid_signature(message: str) -> web.Response:
    return _refusal(403, "InvalidSignatureException", message)


# --- event-stream framing ----------------------------------------------------------------


def frame(headers: dict[str, str], payload: bytes, *, bad_crc: bool = False) -> bytes:
    """One event-stream message: prelude (total length, headers length, CRC32), headers
    (name length, name, type 7 = string, value length, value), payload, message CRC32."""
    head = b""
    for name, value in headers.items():
        encoded = value.encode()
        head += struct.pack("B", len(name)) + name.encode()
        head += b"\x07" + struct.pack(">H", len(encoded)) + encoded
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", binascii.crc32(prelude))
    message = prelude + head + payload
    crc = binascii.crc32(message) ^ (0xFFFFFFFF if bad_crc else 0)
    return message + struct.pack(">I", crc)


def event(event_type: str, payload: dict, *, bad_crc: bool = False) -> bytes:
    headers = {
        ":event-type": event_type,
        ":content-type": "application/json",
        ":message-type": "event",
    }
    # Bedrock pads every event with "p" (so that lengths do not tell the content).
    body = orjson.dumps({**payload, "p": "abcdefghijklmnop"})
    return frame(headers, body, bad_crc=bad_crc)


def exception(exception_type: str, message: str) -> bytes:
    headers = {
        ":exception-type": exception_type,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return frame(headers, orjson.dumps({"message": message}))


# --- what AWS checks ---------------------------------------------------------------------


class FakeBedrock(FakeUpstream):
    """Knows ACCESS_KEY (SECRET_KEY) and TEMP_ACCESS_KEY (TEMP_SECRET_KEY, SESSION_TOKEN)."""

    def __init__(self) -> None:
        super().__init__()
        # access key -> (secret key, session token or None)
        self.keys: dict[str, tuple[str, str | None]] = {
            ACCESS_KEY: (SECRET_KEY, None),
            TEMP_ACCESS_KEY: (TEMP_SECRET_KEY, SESSION_TOKEN),
        }
        self.refused: list[str] = []  # x-amzn-errortype of each refused signature

    def provider_config(
        self, name: str, *, secret: str = SECRET_KEY, temporary: bool = False
    ) -> tuple[str, dict[str, str]]:
        """The `[providers.<name>]` block pointing here, and its credentials' variables:
        ACCESS_KEY's (with `secret` instead of the right one, to be refused), or with
        `temporary` the key that needs its session token."""
        prefix = re.sub(r"\W", "_", name).upper() + "_AWS"
        env = {f"{prefix}_ACCESS_KEY": ACCESS_KEY, f"{prefix}_SECRET_KEY": secret}
        token_line = ""
        if temporary:
            env = {
                f"{prefix}_ACCESS_KEY": TEMP_ACCESS_KEY,
                f"{prefix}_SECRET_KEY": TEMP_SECRET_KEY,
                f"{prefix}_SESSION_TOKEN": SESSION_TOKEN,
            }
            token_line = f'session_token_env = "{prefix}_SESSION_TOKEN"\n'
        block = (
            f"\n[providers.{name}]\n"
            'kind = "bedrock"\n'
            f'base_url = "{self.url}"\n'
            f'region = "{REGION}"\n'
            f'access_key_env = "{prefix}_ACCESS_KEY"\n'
            f'secret_key_env = "{prefix}_SECRET_KEY"\n' + token_line
        )
        return block, env

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/model/{model:[^/]+}/converse", self.converse),
            web.post("/model/{model:[^/]+}/converse-stream", self.converse),
            web.post("/stolen", self.stolen),
        ]

    def model_requests(self, model: str) -> list:
        """Recorded requests for one model id (the model is in the path, not the body)."""
        paths = {f"/model/{model}/converse", f"/model/{model}/converse-stream"}
        return [r for r in self.requests if r.path in paths]  # decoded paths

    def signature_problem(self, request: web.Request, body: bytes) -> web.Response | None:
        """AWS's refusal of this request's signature, or None when it verifies."""
        match = _AUTHORIZATION.fullmatch(request.headers.get("authorization", "").strip())
        if match is None:
            return _refusal(403, "IncompleteSignatureException", "Authorization is malformed.")
        access_key, *scope = match["credential"].split("/")
        if access_key not in self.keys:
            return _refusal(
                403,
                "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            )
        secret, token = self.keys[access_key]
        if request.headers.get("x-amz-security-token") != token:  # both None, or equal
            return _refusal(
                403,
                "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            )
        stamp = request.headers.get("x-amz-date", "")
        try:
            when = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        except ValueError:
            return _refusal(403, "IncompleteSignatureException", "No valid X-Amz-Date.")
        if abs(time.time() - when.timestamp()) > MAX_SKEW_S:
            return _invalid_signature("Signature expired: outside the 5-minute window.")
        if scope != [stamp[:8], REGION, "bedrock", "aws4_request"]:
            return _invalid_signature(f"Credential should be scoped correctly: {scope}.")
        signed = match["signed"].split(";")
        if not {"host", "x-amz-date"} <= set(signed) or any(
            h not in request.headers for h in signed
        ):
            return _invalid_signature("Signed headers must include host and x-amz-date.")
        sha = request.headers.get("x-amz-content-sha256")
        if sha is not None and sha != hashlib.sha256(body).hexdigest():
            return _invalid_signature("x-amz-content-sha256 does not match the body.")
        # The canonical request as AWS makes it from what arrived: the raw path, the
        # signed headers' values, the body.
        received = AWSRequest(
            method=request.method,
            url=f"http://{request.host}{request.raw_path}",
            headers={name: request.headers[name] for name in signed},
            data=body,
        )
        received.context["timestamp"] = stamp
        signer = SigV4Auth(Credentials(access_key, secret, token), "bedrock", REGION)
        canonical = signer.canonical_request(received)
        expected = signer.signature(signer.string_to_sign(received, canonical), received)
        if not hmac.compare_digest(expected, match["signature"]):
            return _invalid_signature(
                "The request signature we calculated does not match the signature you "
                "provided. Check your AWS Secret Access Key and signing method."
            )
        return None

    async def converse(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        await self.record(request)
        refusal = self.signature_problem(request, raw)
        if refusal is not None:
            self.refused.append(refusal.headers["x-amzn-errortype"])
            return refusal
        body = orjson.loads(raw)
        problem = _problem(body)
        if problem:
            return _refusal(400, "ValidationException", problem)
        model = request.match_info["model"]
        if model.startswith("fault-") and model[6:].isdigit():
            status = int(model[6:])
            error_type = _ERROR_TYPES.get(status, "InternalServerException")
            return _refusal(status, error_type, f"rejected: {SECRET}")
        early = await self.before_answer(request, model)
        if early is not None:
            return early
        if request.path.endswith("/converse"):
            return await self.answer(request, model, _answer(model, body))
        return await self._stream(request, model, _events(model, body))

    async def _stream(self, request: web.Request, model: str, frames: list[bytes]):
        response = web.StreamResponse(headers={"content-type": EVENT_STREAM})
        await response.prepare(request)
        for i, message in enumerate(frames):
            await response.write(message)
            if model == "cut-mid-stream" and i == 3:  # messageStart and three text events
                await asyncio.sleep(0.05)
                request.transport.abort()
                return response
        await response.write_eof()
        return response


def _problem(body: dict) -> str | None:
    """What Converse would refuse this body for (ValidationException), if anything."""
    extra = set(body) - _CONVERSE_KEYS
    if extra:
        return f"extraneous key [{sorted(extra)[0]}] is not permitted"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list"
    roles = [m.get("role") for m in messages]
    if roles[0] != "user" or any(r not in ("user", "assistant") for r in roles):
        return "A conversation must start with a user message."
    if any(a == b for a, b in itertools.pairwise(roles)):
        return "A conversation must alternate between user and assistant roles."
    blocks = [b for m in messages for b in m.get("content") or [{}]]
    if any(len(b) != 1 or not set(b) <= _BLOCK_KEYS for b in blocks):
        return "Each content block holds exactly one member."
    if any("toolUse" in b or "toolResult" in b for b in blocks) and not body.get("toolConfig"):
        return "The toolConfig field must be defined when using toolUse and toolResult."
    if not isinstance((body.get("inferenceConfig") or {}).get("maxTokens", 1), int):
        return "maxTokens must be an integer"
    for system in body.get("system") or ():
        if set(system) != {"text"}:
            return "system blocks hold text"
    return None


# --- answers -----------------------------------------------------------------------------


def _usage(model: str) -> dict | str:
    if model == "cached":
        usage = {
            "inputTokens": INPUT_TOKENS - CACHE_READ - CACHE_WRITE,
            "cacheReadInputTokens": CACHE_READ,
            "cacheWriteInputTokens": CACHE_WRITE,
            "outputTokens": OUTPUT_TOKENS,
        }
    else:
        usage = {"inputTokens": INPUT_TOKENS, "outputTokens": OUTPUT_TOKENS}
    usage["totalTokens"] = INPUT_TOKENS + OUTPUT_TOKENS
    if model == "usage-not-object":
        return "lots"
    if model in BROKEN_COUNTS:
        return {key: BROKEN_COUNTS[model] for key in usage}
    return usage


def _reply(model: str, body: dict) -> tuple[list[str], str, dict | None]:
    """(text pieces, stopReason, toolUse start) the fake answers `body` with."""
    last = body["messages"][-1]["content"]
    results = [b["toolResult"] for b in last if "toolResult" in b]
    if results:
        said = "".join(part.get("text", "") for part in results[0].get("content") or ())
        return [f"The tool said: {said}"], "end_turn", None
    tools = (body.get("toolConfig") or {}).get("tools")
    if model == "tool-call" and tools:
        start = {"toolUseId": "tooluse_fake1", "name": tools[0]["toolSpec"]["name"]}
        return ["Let me check."], "tool_use", start
    if model == "length":
        return REPLY_PIECES[:2], "max_tokens", None
    return REPLY_PIECES, "end_turn", None


def _answer(model: str, body: dict) -> dict:
    pieces, stop_reason, tool = _reply(model, body)
    content: list[dict] = []
    if model == "cached":
        content.append({"reasoningContent": {"reasoningText": {"text": REASONING}}})
    content.append({"text": "".join(pieces)})
    if tool:
        content.append({"toolUse": {**tool, "input": {"city": "Paris"}}})
    message = {"role": "assistant", "content": "not a list" if model == MALFORMED else content}
    return {
        "output": {"message": message},
        "stopReason": stop_reason,
        "usage": _usage(model),
        "metrics": {"latencyMs": 42},
    }


def _events(model: str, body: dict) -> list[bytes]:
    pieces, stop_reason, tool = _reply(model, body)
    frames = [event("messageStart", {"role": "assistant"})]
    index = 0
    if model == "cached":
        delta = {"reasoningContent": {"text": REASONING}}
        frames.append(event("contentBlockDelta", {"contentBlockIndex": 0, "delta": delta}))
        frames.append(event("contentBlockStop", {"contentBlockIndex": 0}))
        index = 1
    for i, piece in enumerate(pieces):
        delta = "x" if model == MALFORMED else {"text": piece}
        text = {"contentBlockIndex": index, "delta": delta}
        frames.append(event("contentBlockDelta", text, bad_crc=model == "bad-crc" and i == 2))
        if model == "stream-exception" and i == 1:  # the exception ends the stream
            return [*frames, exception("throttlingException", f"Too many tokens: {SECRET}")]
    frames.append(event("contentBlockStop", {"contentBlockIndex": index}))
    if tool:
        start = {"contentBlockIndex": index + 1, "start": {"toolUse": tool}}
        frames.append(event("contentBlockStart", start))
        for part in TOOL_INPUT_PARTS:
            delta = {"toolUse": {"input": part}}
            frames.append(
                event("contentBlockDelta", {"contentBlockIndex": index + 1, "delta": delta})
            )
        frames.append(event("contentBlockStop", {"contentBlockIndex": index + 1}))
    frames.append(event("messageStop", {"stopReason": stop_reason}))
    if model != "no-metadata":
        frames.append(event("metadata", {"usage": _usage(model), "metrics": {"latencyMs": 42}}))
    return frames
