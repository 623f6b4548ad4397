"""OpenAI-compatible mock upstream for the bench, as fast as one Python core allows.

Routes: POST /v1/chat/completions and POST /v1/responses, plain or `"stream": true`
(Server-Sent Events), and GET /healthz. Usage is always reported, except that chat
streams carry it (in a last chunk) only when `stream_options.include_usage` is set,
as OpenAI does. Each distinct (path, body) is rendered once and cached; only the
16-hex-digit response id changes from one request to the next.

    python bench/mock_upstream.py --port 9101 [--chunks 8] [--delay-ms 0] [--interval-ms 0]

`--chunks` (env MOCK_CHUNKS) is the number of text deltas per answer, which is also
its output token count; `--delay-ms` (env MOCK_DELAY_MS) delays every answer;
`--interval-ms` (env MOCK_INTERVAL_MS) sends a stream's events that far apart (the
head and first event at once, then one event a tick of one shared timer), as a model
generating tokens does; 0 sends a whole stream in one write.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import time

import httptools
import orjson
import uvloop

ID_SLOT = "MOCKIDMOCKIDMOCK"  # replaced by a per-request id of the same length
CHAT_PATH = b"/v1/chat/completions"
RESPONSES_PATH = b"/v1/responses"
CACHE_LIMIT = 1024


def http_response(status: str, content_type: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
    return head % (status.encode(), content_type, len(body)) + body


def json_response(status: str, obj: object) -> bytes:
    return http_response(status, b"application/json", orjson.dumps(obj))


def error_response(status: str, message: str, kind: str = "invalid_request_error") -> bytes:
    return json_response(status, {"error": {"message": message, "type": kind}})


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)
EVENT_END = b"\r\n"  # each event is one HTTP chunk: its size line, the event, this
STREAM_END = b"0\r\n\r\n"


def sse_response(events: list[bytes]) -> bytes:
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in events)
    return SSE_HEAD + chunks + STREAM_END


def paced_pieces(response: bytes) -> list[bytes]:
    """A stream's response cut into the writes of a paced answer: the head with the first
    event, then one event (one HTTP chunk) each, the last with the end of the body."""
    body = response[len(SSE_HEAD) : -len(STREAM_END)]
    chunks, rest = [], body
    while rest:
        size_line, _, after = rest.partition(b"\r\n")
        end = int(size_line, 16) + len(EVENT_END)
        chunks.append(rest[: len(size_line) + 2 + end])
        rest = after[end:]
    chunks[0] = SSE_HEAD + chunks[0]
    chunks[-1] += STREAM_END
    return chunks


def data_event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def named_event(obj: dict) -> bytes:
    return b"event: " + obj["type"].encode() + b"\n" + data_event(obj)


class Answer:
    """What the mock says to one request: model, text pieces and token counts."""

    def __init__(self, request: dict, body_size: int, chunks: int, created: int):
        self.model = str(request.get("model", "mock"))
        self.pieces = [f" tok{i}" for i in range(chunks)]
        self.text = "".join(self.pieces)
        self.input_tokens = max(1, body_size // 4)
        self.output_tokens = chunks
        self.created = created


def chat_usage(a: Answer) -> dict:
    total = a.input_tokens + a.output_tokens
    return {
        "prompt_tokens": a.input_tokens,
        "completion_tokens": a.output_tokens,
        "total_tokens": total,
    }


def chat_completion(a: Answer) -> bytes:
    return json_response(
        "200 OK",
        {
            "id": "chatcmpl-" + ID_SLOT,
            "object": "chat.completion",
            "created": a.created,
            "model": a.model,
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "logprobs": None,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": a.text, "refusal": None},
                }
            ],
            "usage": chat_usage(a),
        },
    )


def chat_stream(a: Answer, include_usage: bool) -> bytes:
    def chunk(delta: dict, finish: str | None) -> dict:
        obj = {
            "id": "chatcmpl-" + ID_SLOT,
            "object": "chat.completion.chunk",
            "created": a.created,
            "model": a.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            obj["usage"] = None
        return obj

    chunks = [chunk({"role": "assistant", "content": ""}, None)]
    chunks += [chunk({"content": piece}, None) for piece in a.pieces]
    chunks.append(chunk({}, "stop"))
    if include_usage:
        chunks.append({**chunk({}, None), "choices": [], "usage": chat_usage(a)})
    return sse_response([data_event(c) for c in chunks] + [b"data: [DONE]\n\n"])


def responses_usage(a: Answer) -> dict:
    return {
        "input_tokens": a.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": a.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": a.input_tokens + a.output_tokens,
    }


def responses_object(a: Answer, done: bool) -> dict:
    output = [message_item(a, a.text)] if done else []
    return {
        "id": "resp_" + ID_SLOT,
        "object": "response",
        "created_at": a.created,
        "status": "completed" if done else "in_progress",
        "model": a.model,
        "output": output,
        "error": None,
        "incomplete_details": None,
        "usage": responses_usage(a) if done else None,
    }


def message_item(a: Answer, text: str | None) -> dict:
    content = [] if text is None else [output_text(text)]
    return {
        "id": "msg_" + ID_SLOT,
        "type": "message",
        "role": "assistant",
        "status": "in_progress" if text is None else "completed",
        "content": content,
    }


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": []}


def responses_stream(a: Answer) -> bytes:
    item = {"item_id": "msg_" + ID_SLOT, "output_index": 0, "content_index": 0}
    events = [
        {"type": "response.created", "response": responses_object(a, done=False)},
        {"type": "response.in_progress", "response": responses_object(a, done=False)},
        {"type": "response.output_item.added", "output_index": 0, "item": message_item(a, None)},
        {"type": "response.content_part.added", **item, "part": output_text("")},
        *({"type": "response.output_text.delta", **item, "delta": p} for p in a.pieces),
        {"type": "response.output_text.done", **item, "text": a.text},
        {"type": "response.content_part.done", **item, "part": output_text(a.text)},
        {"type": "response.output_item.done", "output_index": 0, "item": message_item(a, a.text)},
        {"type": "response.completed", "response": responses_object(a, done=True)},
    ]
    return sse_response([named_event({**e, "sequence_number": n}) for n, e in enumerate(events)])


def render(path: bytes, body: bytes, chunks: int) -> bytes:
    """The whole HTTP response to a POST on a known path, with ID_SLOT for the id."""
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError:
        return error_response("400 Bad Request", "request body is not valid JSON")
    if not isinstance(request, dict):
        return error_response("400 Bad Request", "request body must be a JSON object")
    answer = Answer(request, len(body), chunks, int(time.time()))
    stream = request.get("stream") is True
    if path == RESPONSES_PATH:
        return (
            responses_stream(answer)
            if stream
            else json_response("200 OK", responses_object(answer, done=True))
        )
    if not stream:
        return chat_completion(answer)
    include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
    return chat_stream(answer, include_usage)


HEALTHY = json_response("200 OK", {"status": "ok"})
NOT_FOUND = error_response("404 Not Found", "unknown path", "not_found")
NOT_ALLOWED = error_response("405 Method Not Allowed", "method not allowed")
MALFORMED = error_response("400 Bad Request", "malformed HTTP request")


class MockUpstream:
    """The per-server state: answer settings, the render cache and the id counter."""

    def __init__(self, chunks: int, delay_s: float, interval_s: float = 0.0):
        self.chunks = chunks
        self.delay_s = delay_s
        self.interval_s = interval_s
        self.cache: dict[tuple[bytes, bytes], bytes] = {}
        self.ids = itertools.count(1)
        # Paced streams: (protocol, the writes still to send, keep-alive), one event each a
        # tick of one timer for all of them (a timer per stream costs the mock a core).
        self.paced: list[tuple[MockProtocol, list[bytes], bool]] = []
        self.ticking = False

    def pace(self, protocol: MockProtocol, response: bytes, keep_alive: bool) -> None:
        pieces = paced_pieces(response)
        protocol.send(pieces[0], keep_alive=True)
        self.paced.append((protocol, pieces[:0:-1], keep_alive))  # reversed: pop() is next
        if not self.ticking:
            self.ticking = True
            asyncio.get_running_loop().call_later(self.interval_s, self.tick)

    def tick(self) -> None:
        still = []
        for protocol, pieces, keep_alive in self.paced:
            last = len(pieces) == 1
            protocol.send(pieces.pop(), keep_alive=keep_alive or not last)
            if not last:
                still.append((protocol, pieces, keep_alive))
        self.paced = still
        self.ticking = bool(still)
        if still:
            asyncio.get_running_loop().call_later(self.interval_s, self.tick)

    def respond(self, method: bytes, url: bytes, body: bytes) -> bytes:
        path = url.partition(b"?")[0]
        if path == b"/healthz":
            return HEALTHY if method == b"GET" else NOT_ALLOWED
        if path not in (CHAT_PATH, RESPONSES_PATH):
            return NOT_FOUND
        if method != b"POST":
            return NOT_ALLOWED
        key = (path, body)
        template = self.cache.get(key)
        if template is None:
            if len(self.cache) >= CACHE_LIMIT:
                self.cache.clear()
            template = self.cache[key] = render(path, body, self.chunks)
        return template.replace(ID_SLOT.encode(), b"%016x" % next(self.ids))


class MockProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive connection parsed with httptools, answered in one write."""

    def __init__(self, upstream: MockUpstream):
        self.upstream = upstream
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.send(MALFORMED, keep_alive=False)

    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        method = self.parser.get_method()
        response = self.upstream.respond(method, self.url, b"".join(self.body))
        keep_alive = self.parser.should_keep_alive()
        if self.upstream.interval_s and response.startswith(SSE_HEAD):
            self.upstream.pace(self, response, keep_alive)
        elif self.upstream.delay_s:
            asyncio.get_running_loop().call_later(
                self.upstream.delay_s, self.send, response, keep_alive
            )
        else:
            self.send(response, keep_alive)

    def send(self, response: bytes, keep_alive: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(response)
        if not keep_alive:
            self.transport.close()


async def serve(host: str, port: int, upstream: MockUpstream) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: MockProtocol(upstream), host, port, backlog=4096)
    print(f"mock upstream on http://{host}:{port}/v1", flush=True)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9101)
    parser.add_argument("--chunks", type=int, default=int(os.environ.get("MOCK_CHUNKS", "8")))
    parser.add_argument(
        "--delay-ms", type=float, default=float(os.environ.get("MOCK_DELAY_MS", "0"))
    )
    parser.add_argument(
        "--interval-ms", type=float, default=float(os.environ.get("MOCK_INTERVAL_MS", "0"))
    )
    args = parser.parse_args()
    upstream = MockUpstream(max(1, args.chunks), args.delay_ms / 1000, args.interval_ms / 1000)
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.host, args.port, upstream))


if __name__ == "__main__":
    main()
