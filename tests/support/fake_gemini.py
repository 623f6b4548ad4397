"""A fake Google upstream: the Gemini API's paths, Vertex AI's Gemini paths, and an
OAuth2 token endpoint (see fake_upstream for the fault modes, chosen by the model name
in the path).

It checks what Google checks: the Gemini API's `x-goog-api-key` (missing: 403; wrong:
400 with reason API_KEY_INVALID), Vertex's bearer token (only one this fake issued, else
401), the token endpoint's JWT bearer assertion (RS256 by the service account's key, its
key id, `iss`, Google's token endpoint as `aud`, `scope`, a short life: else 400
invalid_grant), and the request bodies as
proto3 JSON reads them (unknown fields refused, roles, parts, a function response for
each call of the turn before, Gemini 3's thought signature on a replayed call).

Modes beyond fake_upstream's: `cached` (4 of the input tokens cached, 3 thought tokens,
a thought part before the text), `blocked` (the prompt refused: promptFeedback, no
candidate), `safety` (stopped by the safety filters after a first piece), `stream-error`
(streams: one text event, then Google's in-band error object with SECRET; whole
answers: normal).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import shutil
import tempfile
import time
from pathlib import Path

import orjson
from aiohttp import web
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.support.fake_upstream import (
    INPUT_TOKENS,
    MALFORMED,
    OUTPUT_TOKENS,
    REPLY_PIECES,
    SECRET,
    FakeUpstream,
)

GEMINI_KEY = "AIza-fake-gemini-key-61d0c2"
PROJECT, LOCATION = "fake-project", "europe-west4"
CLIENT_EMAIL = "gateway-test@fake-project.iam.gserviceaccount.com"
KEY_ID = "fake-key-id-1"
TOKEN_PATH = "/token"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
# The audience Google takes in an assertion: its token endpoint's own address, whatever
# the file's token_uri (google-auth signs for the first, as the endpoint expects).
GOOGLE_TOKEN_AUDIENCES = {
    "https://oauth2.googleapis.com/token",
    "https://www.googleapis.com/oauth2/v4/token",
    "https://accounts.google.com/o/oauth2/token",
}
THOUGHT_SIGNATURE = "ZmFrZS10aG91Z2h0LXNpZ25hdHVyZQ=="  # what it sends with a function call
SKIP_SIGNATURE = "skip_thought_signature_validator"  # Google's value for foreign calls
CACHED_TOKENS, THOUGHT_TOKENS = 4, 3
THOUGHT = "Thinking it over."
BLOCKED, SAFETY, STREAM_ERROR = "blocked", "safety", "stream-error"

_TOP = {
    "contents",
    "systemInstruction",
    "tools",
    "toolConfig",
    "generationConfig",
    "safetySettings",
    "cachedContent",
    "labels",
}
_PART = {
    "text",
    "thought",
    "thoughtSignature",
    "functionCall",
    "functionResponse",
    "inlineData",
    "fileData",
}
_DATA = {"text", "functionCall", "functionResponse", "inlineData", "fileData"}
_GENERATION = {
    "maxOutputTokens",
    "temperature",
    "topP",
    "topK",
    "seed",
    "stopSequences",
    "presencePenalty",
    "frequencyPenalty",
    "responseMimeType",
    "responseJsonSchema",
    "candidateCount",
    "thinkingConfig",
}
_DECLARATION = {"name", "description", "parameters", "parametersJsonSchema"}


def google_error(status: int, code: str, message: str, reason: str | None = None) -> web.Response:
    error: dict = {"code": status, "message": message, "status": code}
    if reason is not None:
        info = "type.googleapis.com/google.rpc.ErrorInfo"
        error["details"] = [{"@type": info, "reason": reason, "domain": "googleapis.com"}]
    return web.json_response({"error": error}, status=status)


def _unknown(found: dict, known: set[str], where: str) -> str | None:
    extra = sorted(set(found) - known)
    if extra:
        return f"Invalid JSON payload received. Unknown name \"{extra[0]}\" at '{where}'"
    return None


def _part_problem(part: object, where: str) -> str | None:
    if not isinstance(part, dict):
        return f"{where}: a part is an object"
    if problem := _unknown(part, _PART, where):
        return problem
    if len(_DATA & set(part)) != 1:
        return f"{where}: a part holds exactly one kind of data"
    call, response = part.get("functionCall"), part.get("functionResponse")
    if call is not None and not (
        isinstance(call.get("name"), str) and isinstance(call.get("args"), dict)
    ):
        return f"{where}.functionCall: a name and args as an object"
    if response is not None and not (
        isinstance(response.get("name"), str) and isinstance(response.get("response"), dict)
    ):
        return f"{where}.functionResponse: a name and a response object"
    return None


def _contents_problem(contents: object) -> str | None:
    if not isinstance(contents, list) or not contents:
        return "contents is not specified"
    calls_before = 0  # function calls of the model turn before
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        if not isinstance(content, dict) or content.get("role") not in ("user", "model"):
            return f"{where}: please use a valid role: user, model"
        parts = content.get("parts")
        if not isinstance(parts, list) or not parts:
            return f"{where}: contents.parts must not be empty"
        for j, part in enumerate(parts):
            if problem := _part_problem(part, f"{where}.parts[{j}]"):
                return problem
        calls = [p for p in parts if "functionCall" in p]
        responses = [p for p in parts if "functionResponse" in p]
        if responses and len(responses) != calls_before:
            return (
                "Please ensure that the number of function response parts is equal to the"
                " number of function call parts of the function call turn."
            )
        if calls and calls[0].get("thoughtSignature") not in (THOUGHT_SIGNATURE, SKIP_SIGNATURE):
            return f"Function call is missing a thought_signature in {where}"
        calls_before = len(calls) if content["role"] == "model" else 0
    return None


def _tools_problem(tools: object) -> str | None:
    if not isinstance(tools, list):
        return "tools is a list"
    for tool in tools:
        declarations = tool.get("functionDeclarations") if isinstance(tool, dict) else None
        if not isinstance(declarations, list) or not declarations:
            return "tools[]: functionDeclarations"
        for declaration in declarations:
            if problem := _unknown(declaration, _DECLARATION, "function_declarations"):
                return problem
            if not isinstance(declaration.get("name"), str):
                return "function_declarations[].name is required"
            if "parameters" in declaration and "parametersJsonSchema" in declaration:
                return "parameters and parametersJsonSchema are mutually exclusive"
    return None


def request_problem(body: dict) -> str | None:
    """What Google would refuse this generateContent body for (400), if anything."""
    if problem := _unknown(body, _TOP, "GenerateContentRequest"):
        return problem
    if problem := _contents_problem(body.get("contents")):
        return problem
    system = body.get("systemInstruction")
    if system is not None and not all(
        isinstance(p, dict) and set(p) == {"text"} for p in system.get("parts") or [None]
    ):
        return "systemInstruction: text parts"
    if "tools" in body and (problem := _tools_problem(body["tools"])):
        return problem
    config = (body.get("toolConfig") or {}).get("functionCallingConfig")
    if config is not None:
        if config.get("mode") not in ("AUTO", "ANY", "NONE", "VALIDATED"):
            return "toolConfig.functionCallingConfig.mode"
        if "allowedFunctionNames" in config and config["mode"] != "ANY":
            return "allowedFunctionNames is only allowed with mode ANY"
    generation = body.get("generationConfig") or {}
    if problem := _unknown(generation, _GENERATION, "generation_config"):
        return problem
    limit = generation.get("maxOutputTokens")
    if limit is not None and (type(limit) is not int or limit < 1):
        return "generation_config.max_output_tokens"
    if len(generation.get("stopSequences") or ()) > 5:
        return "generation_config.stop_sequences: at most 5"
    return None


def _b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _model_of(path: str) -> str | None:
    """The upstream model name in a generate path (…/models/NAME:method)."""
    tail = path.rpartition("/models/")[2]
    return tail.partition(":")[0] or None


class FakeGemini(FakeUpstream):
    """Both APIs on one server; `provider_config` gives a `kind = "gemini"` block."""

    def __init__(self, api_key: str = GEMINI_KEY) -> None:
        super().__init__()
        self.api_key = api_key
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.issued: set[str] = set()  # access tokens it handed out
        self.token_requests = 0
        self.refused_assertions = 0
        self.folder = Path(tempfile.mkdtemp(prefix="fake-google-"))

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def routes(self) -> list[web.RouteDef]:
        vertex = "/v1/projects/{project}/locations/{location}/publishers/google/models/{target}"
        return [
            web.post("/v1beta/models/{target}", self.gemini),
            web.post(vertex, self.vertex),
            web.post(TOKEN_PATH, self.token),
            web.post("/stolen", self.stolen),
        ]

    def provider_config(self, name: str) -> tuple[str, dict[str, str]]:
        """The `[providers.NAME]` block pointing at this fake, and its key's variable."""
        block = f"""
[providers."{name}"]
kind = "gemini"
base_url = "{self.url}"
api_key_env = "FAKE_GEMINI_KEY"
"""
        return block, {"FAKE_GEMINI_KEY": self.api_key}

    def sent(self, *, model: str | None = None, marker: str | None = None) -> list:
        """Recorded requests for an upstream model (named in the path), or whose body
        contains `marker`."""
        return [
            r
            for r in self.requests
            if (model is None or _model_of(r.path) == model)
            and (marker is None or marker in orjson.dumps(r.body).decode())
        ]

    # --- service accounts and the token endpoint -----------------------------------------

    def service_account_file(self, path: Path, *, rogue: bool = False) -> Path:
        """A service-account key file whose token_uri is this fake; `rogue`: signed with
        another key than the one the fake knows (its assertions are refused)."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048) if rogue else self.key
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        info = {
            "type": "service_account",
            "project_id": PROJECT,
            "private_key_id": KEY_ID,
            "private_key": pem.decode(),
            "client_email": CLIENT_EMAIL,
            "client_id": "100000000000000000001",
            "token_uri": self.url + TOKEN_PATH,
        }
        path.write_text(json.dumps(info))
        return path

    def _assertion_problem(self, assertion: str) -> str | None:
        try:
            head, claims, signature = assertion.split(".")
            header, payload = json.loads(_b64url(head)), json.loads(_b64url(claims))
            self.key.public_key().verify(
                _b64url(signature),
                f"{head}.{claims}".encode(),
                padding.PKCS1v15(),
                hashes.SHA256(),
            )
        except (ValueError, InvalidSignature):
            return "Invalid JWT Signature."
        if header.get("alg") != "RS256" or header.get("kid") != KEY_ID:
            return "Invalid JWT: unknown key"
        if payload.get("iss") != CLIENT_EMAIL:
            return "Invalid JWT: iss"
        if payload.get("aud") not in GOOGLE_TOKEN_AUDIENCES:
            return "Invalid JWT: aud"
        if CLOUD_PLATFORM not in str(payload.get("scope", "")).split():
            return "Invalid OAuth scope"
        now, iat, exp = time.time(), payload.get("iat"), payload.get("exp")
        if not (isinstance(iat, int) and isinstance(exp, int)):
            return "Invalid JWT: iat and exp"
        if iat > now + 60 or exp <= now or exp - iat > 3600:
            return (
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a"
                " reasonable timeframe."
            )
        return None

    async def token(self, request: web.Request) -> web.Response:
        self.token_requests += 1
        form = await request.post()
        if form.get("grant_type") != JWT_BEARER:
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        problem = self._assertion_problem(str(form.get("assertion", "")))
        if problem is not None:
            self.refused_assertions += 1
            error = {"error": "invalid_grant", "error_description": problem}
            return web.json_response(error, status=400)
        token = "ya29.fake-" + secrets.token_urlsafe(24)
        self.issued.add(token)
        return web.json_response(
            {"access_token": token, "expires_in": 3600, "token_type": "Bearer"}
        )

    # --- the generate endpoints ------------------------------------------------------------

    async def gemini(self, request: web.Request) -> web.StreamResponse:
        body = await self.record(request)
        key = request.headers.get("x-goog-api-key")
        if key is None:
            message = "Method doesn't allow unregistered callers."
            return google_error(403, "PERMISSION_DENIED", message)
        if key != self.api_key:
            message = f"API key not valid. Please pass a valid API key. {SECRET}"
            return google_error(400, "INVALID_ARGUMENT", message, reason="API_KEY_INVALID")
        return await self._serve(request, body, embeddings=True)

    async def vertex(self, request: web.Request) -> web.StreamResponse:
        body = await self.record(request)
        authorization = request.headers.get("authorization", "")
        if authorization.removeprefix("Bearer ") not in self.issued:
            message = "Request had invalid authentication credentials."
            return google_error(401, "UNAUTHENTICATED", message)
        info = request.match_info
        if (info["project"], info["location"]) != (PROJECT, LOCATION):
            return google_error(403, "PERMISSION_DENIED", "Permission denied on the project.")
        return await self._serve(request, body, embeddings=False)

    async def _serve(
        self, request: web.Request, body: dict, *, embeddings: bool
    ) -> web.StreamResponse:
        model, _, method = request.match_info["target"].partition(":")
        if model.startswith("fault-") and model[6:].isdigit():
            status = int(model[6:])
            return google_error(status, "FAULT", f"rejected: {SECRET}")
        early = await self.before_answer(request, model)
        if early is not None:
            return early
        if method == "batchEmbedContents" and embeddings:
            return await self._embed(request, model, body)
        if method not in ("generateContent", "streamGenerateContent"):
            return google_error(404, "NOT_FOUND", f"{method} is not a method of this API")
        problem = request_problem(body)
        if problem is not None:
            return google_error(400, "INVALID_ARGUMENT", problem)
        if method == "generateContent":
            return await self.answer(request, model, _answer(model, body))
        if request.query.get("alt") != "sse":
            return google_error(400, "INVALID_ARGUMENT", "this fake streams SSE only (alt=sse)")
        events = [b"data: " + orjson.dumps(e) + b"\r\n\r\n" for e in _events(model, body)]
        return await self.stream(request, model, events, text_from=0)

    async def _embed(self, request: web.Request, model: str, body: dict) -> web.StreamResponse:
        entries = body.get("requests")
        if problem := _unknown(body, {"requests"}, "BatchEmbedContentsRequest"):
            return google_error(400, "INVALID_ARGUMENT", problem)
        if not isinstance(entries, list) or not 0 < len(entries) <= 100:
            return google_error(400, "INVALID_ARGUMENT", "at most 100 requests in a batch")
        vectors = []
        for entry in entries:
            parts = (entry.get("content") or {}).get("parts")
            dimensions = entry.get("outputDimensionality", 8)
            if (
                _unknown(entry, {"model", "content", "outputDimensionality"}, "requests")
                or entry.get("model") != f"models/{model}"
                or not parts
                or not all(isinstance(p, dict) and set(p) == {"text"} for p in parts)
                or type(dimensions) is not int
            ):
                return google_error(400, "INVALID_ARGUMENT", "invalid EmbedContentRequest")
            vectors.append(embedding_of("".join(p["text"] for p in parts), dimensions))
        if model == MALFORMED:
            return web.json_response({"embeddings": "not a list"})
        return await self.answer(request, model, {"embeddings": [{"values": v} for v in vectors]})


def embedding_of(text: str, dimensions: int) -> list[float]:
    """The fake's deterministic vector for a text."""
    digest = hashlib.sha256(text.encode()).digest()
    return [round(digest[i % len(digest)] / 255, 4) for i in range(dimensions)]


def _reply(model: str, body: dict) -> tuple[list[str], str, dict | None]:
    """(text pieces, finishReason, functionCall part) the fake answers `body` with."""
    last = body["contents"][-1]["parts"]
    results = [p["functionResponse"] for p in last if "functionResponse" in p]
    if results:
        return [f"The tool said: {results[0]['response'].get('content')}"], "STOP", None
    tools = body.get("tools")
    if model == "tool-call" and tools:
        name = tools[0]["functionDeclarations"][0]["name"]
        call = {"functionCall": {"name": name, "args": {"city": "Paris"}}}
        return [], "STOP", {**call, "thoughtSignature": THOUGHT_SIGNATURE}
    if model == "length":
        return REPLY_PIECES[:2], "MAX_TOKENS", None
    if model == SAFETY:
        return REPLY_PIECES[:1], "SAFETY", None
    return REPLY_PIECES, "STOP", None


def _usage(model: str) -> dict:
    if model == "cached":
        return {
            "promptTokenCount": INPUT_TOKENS,
            "cachedContentTokenCount": CACHED_TOKENS,
            "candidatesTokenCount": OUTPUT_TOKENS - THOUGHT_TOKENS,
            "thoughtsTokenCount": THOUGHT_TOKENS,
            "totalTokenCount": INPUT_TOKENS + OUTPUT_TOKENS,
        }
    return {
        "promptTokenCount": INPUT_TOKENS,
        "candidatesTokenCount": OUTPUT_TOKENS,
        "totalTokenCount": INPUT_TOKENS + OUTPUT_TOKENS,
    }


def _response(model: str, parts: list | str, finish: str | None, usage: dict) -> dict:
    candidate: dict = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    return {
        "candidates": [candidate],
        "usageMetadata": usage,
        "modelVersion": model,
        "responseId": "fake-response-7c1",
    }


def _blocked() -> dict:
    usage = {"promptTokenCount": INPUT_TOKENS, "totalTokenCount": INPUT_TOKENS}
    return {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": usage}


def _answer(model: str, body: dict) -> dict:
    if model == BLOCKED:
        return _blocked()
    pieces, finish, call = _reply(model, body)
    parts: list = [{"text": "".join(pieces)}] if pieces else []
    if model == "cached":
        parts.insert(0, {"text": THOUGHT, "thought": True})
    if call is not None:
        parts.append(call)
    answer = _response(model, parts, finish, _usage(model))
    if model == MALFORMED:
        answer["candidates"] = "not a list"
    return answer


def _events(model: str, body: dict) -> list[dict]:
    """The stream: a text piece per event, a function call in its own, the finishReason
    and the whole usage on the last (earlier ones carry the prompt's count only)."""
    if model == BLOCKED:
        return [_blocked()]
    pieces, finish, call = _reply(model, body)
    if model == STREAM_ERROR:
        error = {"code": 500, "message": f"Internal error: {SECRET}", "status": "INTERNAL"}
        return [_response(model, [{"text": pieces[0]}], None, {}), {"error": error}]
    steps: list[list] = [[{"text": piece}] for piece in pieces]
    if model == "cached":
        steps.insert(0, [{"text": THOUGHT, "thought": True}])
    if call is not None:
        steps.append([call])
    running = {"promptTokenCount": INPUT_TOKENS, "totalTokenCount": INPUT_TOKENS}
    events = [_response(model, parts, None, running) for parts in steps]
    events[-1] = _response(model, steps[-1], finish, _usage(model))
    if model == MALFORMED:  # the first event is fine: the failure comes in band
        for event in events[1:]:
            event["candidates"][0]["content"]["parts"] = "not a list"
    return events


class FakeVertex(FakeGemini):
    """The same server; `provider_config` gives a `kind = "vertex"` block with a
    service-account file of its own (the token endpoint is the fake's)."""

    def provider_config(self, name: str) -> tuple[str, dict[str, str]]:
        path = self.service_account_file(self.folder / f"{name}.json")
        block = f"""
[providers."{name}"]
kind = "vertex"
base_url = "{self.url}"
project = "{PROJECT}"
location = "{LOCATION}"
credentials_file = {json.dumps(str(path))}
"""
        return block, {}


# --- what the gemini and vertex tests configure ----------------------------------------------

# 11 tokens in and 5 out cost 11 x 1.25 + 5 x 10.00 = 63.75 micro-units: 64 rounded up.
INPUT_PRICE, OUTPUT_PRICE = "1.25", "10.00"
COST = "0.000064"
# The modes both kinds' tests serve as `<prefix>/<mode>` models.
MODES = [
    "normal",
    "tool-call",
    "length",
    "cached",
    "fault-400",
    "fault-401",
    "fault-403",
    "fault-429",
    "fault-500",
    "cut-mid-stream",
    MALFORMED,
    BLOCKED,
    SAFETY,
    STREAM_ERROR,
]
# A second provider that serves when the first's credentials are rejected.
TO_ECHO = 'fallbacks = [{provider = "local", upstream = "echo-1"}]'


def model_block(model_id: str, provider: str, upstream: str, extra: str = "") -> str:
    return f"""
[models."{model_id}"]
provider = "{provider}"
upstream = "{upstream}"
input_price_per_mtok = "{INPUT_PRICE}"
output_price_per_mtok = "{OUTPUT_PRICE}"
supports_tools = true
max_output_tokens = 256
{extra}
"""
