"""Chat Completions <-> Gemini's generateContent: requests, answers, stream events and
embeddings. Pure functions, shapes and one small state machine, no I/O (Gemini's API and
Vertex AI's Gemini speak the same bodies).

System and developer messages become `systemInstruction`; assistant turns are `model`
turns and tool results `functionResponse` parts in a user turn; consecutive turns of
one role merge. Parts marked `thought` are the model's reasoning, never shown as content.
Gemini 3 refuses a replayed function call without the `thoughtSignature` it came with:
an answer's tool call carries it as `extra_content.google.thought_signature` (the
convention of Google's own OpenAI-compatible endpoint), and a replayed call that lost
it carries the validator-skipping value Google documents for that case.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any

import msgspec
import orjson

from model_gateway.gateway.inference.tokens import content_text
from model_gateway.gateway.inference.usage import token_count
from model_gateway.gateway.providers.anthropic.anthropic_messages import (
    text_blocks,
    tool_definitions,
    tool_use_block,
)
from model_gateway.gateway.providers.chunks import completion_chunk
from model_gateway.pipeline.errors import InvalidRequest

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject

# https://ai.google.dev/gemini-api/docs/thought-signatures: for calls not made by the model.
SKIP_SIGNATURE = "skip_thought_signature_validator"
# The most requests one batchEmbedContents call takes.
EMBED_BATCH = 100

# Looked up with the candidate's finishReason, which may be absent or null.
FINISH_REASONS: dict[str | None, str] = {
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}


# --- what the gateway reads of Gemini's answers (checked like gateway.providers.shapes) ---


class _Shape(msgspec.Struct, kw_only=True, rename="camel"):
    """Unknown fields pass; every field is optional and may be null."""


class _FunctionCall(_Shape):
    name: str | None = None
    args: dict[str, Any] | None = None


class _Part(_Shape):
    text: str | None = None
    thought: bool | None = None
    function_call: _FunctionCall | None = None
    thought_signature: str | None = None


class _Content(_Shape):
    parts: list[_Part] | None = None


class _Candidate(_Shape):
    content: _Content | None = None
    finish_reason: str | None = None


class _PromptFeedback(_Shape):
    block_reason: str | None = None


class GenerateContentAnswer(_Shape):
    """A GenerateContentResponse: a whole answer, or one event of its stream. Usage is
    judged count by count (chat_usage); an in-band `error` is the upstream's failure."""

    candidates: list[_Candidate] | None = None
    prompt_feedback: _PromptFeedback | None = None
    response_id: str | None = None
    usage_metadata: Any = None
    error: Any = None


class _Error(_Shape):
    details: list[Any] | None = None


class _ErrorBody(_Shape):
    error: _Error | None = None


def key_invalid(body: bytes) -> bool:
    """Whether an error body is Google's word for a bad API key (a 400 whose
    `error.details[].reason` is API_KEY_INVALID)."""
    try:
        error = msgspec.json.decode(body, type=_ErrorBody).error
    except msgspec.DecodeError:  # not JSON, cut short, or another shape
        return False
    details = (error.details if error is not None else None) or ()
    return any(isinstance(d, dict) and d.get("reason") == "API_KEY_INVALID" for d in details)


class _Embedding(msgspec.Struct):
    values: list[float]


class BatchEmbedAnswer(msgspec.Struct):
    """A batchEmbedContents answer: one embedding per request, in order (required)."""

    embeddings: list[_Embedding]


# --- requests ------------------------------------------------------------------------------


def _append(contents: list[JSONObject], role: str, parts: list[JSONObject]) -> None:
    if not parts:
        return
    if contents and contents[-1]["role"] == role:
        contents[-1]["parts"].extend(parts)
    else:
        contents.append({"role": role, "parts": parts})


def _signature(call: JSONObject) -> str | None:
    extra = call.get("extra_content")
    google = extra.get("google") if isinstance(extra, dict) else None
    signature = google.get("thought_signature") if isinstance(google, dict) else None
    return signature if isinstance(signature, str) and signature else None


def _text_parts(message: JSONObject, where: str) -> list[JSONObject]:
    blocks = text_blocks(message.get("content"), f"{where}.content")
    return [{"text": block["text"]} for block in blocks]


def _model_parts(message: JSONObject, where: str) -> list[JSONObject]:
    parts = _text_parts(message, where)
    for k, call in enumerate(message.get("tool_calls") or ()):
        use = tool_use_block(call, f"{where}.tool_calls.{k}")
        part: JSONObject = {"functionCall": {"name": use["name"], "args": use["input"]}}
        signature = _signature(call)
        if signature is not None or k == 0:  # only a turn's first call must carry one
            part["thoughtSignature"] = signature or SKIP_SIGNATURE
        parts.append(part)
    return parts


def _function_response(message: JSONObject, names: dict[str, str], where: str) -> JSONObject:
    name = message.get("name") or names.get(message.get("tool_call_id") or "")
    if not name:
        raise InvalidRequest(
            "A tool result must answer an earlier tool call of the conversation.",
            param=f"{where}.tool_call_id",
        )
    response = {"content": content_text(message.get("content"))}
    return {"functionResponse": {"name": name, "response": response}}


def _tool_config(choice: Any) -> JSONObject:
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        return {"mode": "ANY", "allowedFunctionNames": [name]}
    return {"mode": {"required": "ANY", "none": "NONE"}.get(choice, "AUTO")}


def _generation_config(request: JSONObject) -> JSONObject:
    config: JSONObject = {
        "maxOutputTokens": request.get("max_completion_tokens") or request.get("max_tokens")
    }
    for ours, theirs in (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("seed", "seed"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ):
        if request.get(ours) is not None:
            config[theirs] = request[ours]
    stop = request.get("stop")
    if stop:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    response_format = request.get("response_format") or {}
    if response_format.get("type") in ("json_object", "json_schema"):
        config["responseMimeType"] = "application/json"
        json_schema = response_format.get("json_schema")
        if isinstance(json_schema, dict) and json_schema.get("schema") is not None:
            config["responseJsonSchema"] = json_schema["schema"]
    return config


def generate_request(request: JSONObject) -> JSONObject:
    """A Chat Completions request (with its output limit set) as a generateContent body."""
    system: list[JSONObject] = []
    contents: list[JSONObject] = []
    names: dict[str, str] = {}  # tool call id -> function name, for the results
    for i, message in enumerate(request["messages"]):
        role, where = message["role"], f"messages.{i}"
        if role in ("system", "developer"):
            text = content_text(message.get("content"))
            if text:
                system.append({"text": text})
        elif role in ("tool", "function"):
            _append(contents, "user", [_function_response(message, names, where)])
        elif role == "assistant":
            for call in message.get("tool_calls") or ():
                names[call.get("id") or ""] = (call.get("function") or {}).get("name") or ""
            _append(contents, "model", _model_parts(message, where))
        else:
            _append(contents, "user", _text_parts(message, where))
    body: JSONObject = {"contents": contents, "generationConfig": _generation_config(request)}
    if system:
        body["systemInstruction"] = {"parts": system}
    if request.get("tools"):
        declarations = []
        for tool in tool_definitions(request["tools"]):
            declaration = {"name": tool["name"], "parametersJsonSchema": tool["input_schema"]}
            if tool.get("description"):
                declaration["description"] = tool["description"]
            declarations.append(declaration)
        body["tools"] = [{"functionDeclarations": declarations}]
        if "tool_choice" in request:
            body["toolConfig"] = {"functionCallingConfig": _tool_config(request["tool_choice"])}
    return body


# --- answers --------------------------------------------------------------------------------


def chat_usage(metadata: Any) -> JSONObject:
    """usageMetadata as chat usage: thoughts are output, tool-use prompt tokens input; a
    count the upstream broke stays
    None, never a guess. (Proto3 JSON leaves out a count of 0: absent is 0, but for the
    prompt, which is never empty: left to the gateway's count.)"""
    usage = metadata if isinstance(metadata, dict) else None
    if usage is None:
        return {"prompt_tokens": None, "completion_tokens": None, "total_tokens": None}
    prompt = token_count(usage.get("promptTokenCount"))
    # Tokens of tools' results Google ran for the request are input too, reported apart.
    tool_use = token_count(usage.get("toolUsePromptTokenCount", 0))
    prompt = None if prompt is None or tool_use is None else prompt + tool_use
    candidates = token_count(usage.get("candidatesTokenCount", 0))
    thoughts = token_count(usage.get("thoughtsTokenCount", 0))
    completion = None if candidates is None or thoughts is None else candidates + thoughts
    total = None if prompt is None or completion is None else prompt + completion
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": total,
        "prompt_tokens_details": {
            "cached_tokens": token_count(usage.get("cachedContentTokenCount", 0)) or 0
        },
        "completion_tokens_details": {"reasoning_tokens": thoughts or 0},
    }


def _tool_call(part: JSONObject) -> JSONObject:
    call = part["functionCall"]
    tool_call: JSONObject = {
        "id": "call_" + secrets.token_hex(12),
        "type": "function",
        "function": {
            "name": call.get("name"),
            "arguments": orjson.dumps(call.get("args") or {}).decode(),
        },
    }
    if part.get("thoughtSignature"):
        tool_call["extra_content"] = {"google": {"thought_signature": part["thoughtSignature"]}}
    return tool_call


def _candidate(answer: JSONObject) -> JSONObject:
    return next(iter(answer.get("candidates") or ()), None) or {}


def _parts(candidate: JSONObject) -> list[JSONObject]:
    return [part for part in (candidate.get("content") or {}).get("parts") or () if part]


def _text(parts: list[JSONObject]) -> str:
    return "".join(part.get("text") or "" for part in parts if not part.get("thought"))


def _finish_reason(answer: JSONObject, calls: bool) -> str | None:
    """The chat finish_reason of an answer (or event), None while it is not finished."""
    reason = _candidate(answer).get("finishReason")
    if reason is None and (answer.get("promptFeedback") or {}).get("blockReason"):
        return "content_filter"  # the prompt was refused: no candidate at all
    if reason is None:
        return None
    return "tool_calls" if calls else FINISH_REASONS.get(reason, "stop")


def chat_completion(answer: JSONObject, model: str) -> JSONObject:
    """A generateContent answer as a chat completion."""
    parts = _parts(_candidate(answer))
    calls = [_tool_call(part) for part in parts if part.get("functionCall")]
    text = _text(parts)
    reply: JSONObject = {
        "role": "assistant",
        "content": text or (None if calls else ""),
        "refusal": None,
    }
    if calls:
        reply["tool_calls"] = calls
    return {
        "id": "chatcmpl-" + str(answer.get("responseId") or secrets.token_hex(12)),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": reply,
                "finish_reason": _finish_reason(answer, bool(calls)) or "stop",
                "logprobs": None,
            }
        ],
        "usage": chat_usage(answer.get("usageMetadata")),
    }


class GeminiChunkTranslator:
    """streamGenerateContent events in, chat completion chunks out (then a usage chunk).

    Each event carries the next parts of the answer; the one with a finishReason (or a
    refused prompt) ends it, and its usageMetadata is the whole answer's."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.id = "chatcmpl-" + secrets.token_hex(12)
        self.created = int(time.time())
        self.started = False
        self.calls = 0  # tool calls so far: the next one's index
        self.usage: Any = None  # the latest usageMetadata, as reported
        self.done = False

    def _chunk(self, delta: JSONObject, finish_reason: str | None = None) -> JSONObject:
        return completion_chunk(self.id, self.created, self.model, delta, finish_reason)

    def feed(self, event: JSONObject) -> list[JSONObject]:
        chunks: list[JSONObject] = []
        if not self.started:
            self.started = True
            if event.get("responseId"):
                self.id = "chatcmpl-" + str(event["responseId"])
            chunks.append(self._chunk({"role": "assistant", "content": ""}))
        if event.get("usageMetadata") is not None:
            self.usage = event["usageMetadata"]
        for part in _parts(_candidate(event)):
            if part.get("functionCall"):
                call = {"index": self.calls, **_tool_call(part)}
                self.calls += 1
                chunks.append(self._chunk({"tool_calls": [call]}))
            elif part.get("text") and not part.get("thought"):
                chunks.append(self._chunk({"content": part["text"]}))
        finish_reason = _finish_reason(event, self.calls > 0)
        if finish_reason is not None:
            self.done = True
            usage_chunk = {**self._chunk({}), "choices": [], "usage": chat_usage(self.usage)}
            chunks += [self._chunk({}, finish_reason), usage_chunk]
        return chunks


# --- embeddings ------------------------------------------------------------------------------


def embed_texts(request: JSONObject) -> list[str]:
    """An embeddings request's input as texts: Gemini takes no token ids."""
    inputs = request["input"]
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not all(isinstance(text, str) for text in texts):
        raise InvalidRequest("This model takes text input only, not token ids.", param="input")
    return list(texts)


def embed_request(texts: list[str], model: str, dimensions: Any) -> JSONObject:
    """A batchEmbedContents body: one request per text."""
    requests = []
    for text in texts:
        entry: JSONObject = {"model": f"models/{model}", "content": {"parts": [{"text": text}]}}
        if dimensions is not None:
            entry["outputDimensionality"] = dimensions
        requests.append(entry)
    return {"requests": requests}


def embeddings_answer(vectors: list[list[float]], model: str) -> JSONObject:
    """Vectors in OpenAI's embeddings shape, without usage: Gemini reports no count, so the
    receipt bills the gateway's own and says so (`usage_source` "gateway")."""
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": vector}
            for i, vector in enumerate(vectors)
        ],
        "model": model,
    }
