"""A fake Anthropic Messages upstream (see fake_upstream for its fault modes).

It checks the protocol's headers (x-api-key, anthropic-version) and the shapes the
Messages API insists on (alternating roles, a max_tokens, no system role in messages).
"""

from __future__ import annotations

import itertools

from aiohttp import web

from tests.support.fake_upstream import (
    INPUT_TOKENS,
    MALFORMED,
    OUTPUT_TOKENS,
    REPLY_PIECES,
    FakeUpstream,
    sse,
    usage_for,
)

TOOL_INPUT_PARTS = ['{"city":', ' "Paris"}']


def _problem(body: dict) -> str | None:
    """What the real API would reject this body for, if anything."""
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens is required"
    roles = [m.get("role") for m in body.get("messages", [])]
    if not roles or roles[0] != "user" or any(r not in ("user", "assistant") for r in roles):
        return "messages must start with user and hold only user and assistant"
    if any(a == b for a, b in itertools.pairwise(roles)):
        return "roles must alternate"
    return None


def _reply(body: dict) -> tuple[list[str], str, dict | None]:
    """(text pieces, stop_reason, tool_use block) the fake answers `body` with."""
    model = body["model"]
    last = body["messages"][-1]["content"]
    results = [b for b in last if isinstance(b, dict) and b.get("type") == "tool_result"]
    if results:
        return [f"The tool said: {results[0].get('content')}"], "end_turn", None
    if model == "tool-call" and body.get("tools"):
        block = {"type": "tool_use", "id": "toolu_fake1", "name": body["tools"][0]["name"]}
        return ["Let me check."], "tool_use", block
    if model == "length":
        return REPLY_PIECES[:2], "max_tokens", None
    return REPLY_PIECES, "end_turn", None


class FakeAnthropic(FakeUpstream):
    def __init__(self, credential: str) -> None:
        super().__init__()
        self.credential = credential

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/messages", self.messages), web.post("/stolen", self.stolen)]

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await self.record(request)
        if request.headers.get("x-api-key") != self.credential:
            error = {"type": "authentication_error", "message": "invalid x-api-key"}
            return web.json_response({"type": "error", "error": error}, status=401)
        problem = None if request.headers.get("anthropic-version") else "no anthropic-version"
        problem = problem or _problem(body)
        if problem:
            error = {"type": "invalid_request_error", "message": problem}
            return web.json_response({"type": "error", "error": error}, status=400)
        model = body["model"]
        early = await self.before_answer(request, model)
        if early is not None:
            return early
        pieces, stop_reason, tool = _reply(body)
        usage = usage_for(model, {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS})
        if not body.get("stream"):
            content = [{"type": "text", "text": "".join(pieces)}]
            if tool:
                content.append({**tool, "input": {"city": "Paris"}})
            message = {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": "not a list" if model == MALFORMED else content,
                "stop_reason": stop_reason,
                "stop_sequence": None,
                "usage": usage,
            }
            return await self.answer(request, model, message)

        def event(name: str, **fields) -> bytes:
            return sse({"type": name, **fields}, event=name)

        start = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "usage": usage_for(model, {"input_tokens": INPUT_TOKENS, "output_tokens": 1}),
        }
        events = [
            event("message_start", message=start),
            event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            *[
                event(
                    "content_block_delta",
                    index=0,
                    delta="x" if model == MALFORMED else {"type": "text_delta", "text": p},
                )
                for p in pieces
            ],
            event("ping"),
            event("content_block_stop", index=0),
        ]
        if tool:
            events.append(
                event("content_block_start", index=1, content_block={**tool, "input": {}})
            )
            events += [
                event(
                    "content_block_delta",
                    index=1,
                    delta={"type": "input_json_delta", "partial_json": part},
                )
                for part in TOOL_INPUT_PARTS
            ]
            events.append(event("content_block_stop", index=1))
        delta_usage = usage_for(model, {"output_tokens": OUTPUT_TOKENS})
        events += [
            event("message_delta", delta={"stop_reason": stop_reason}, usage=delta_usage),
            event("message_stop"),
        ]
        return await self.stream(request, model, events, text_from=2)
