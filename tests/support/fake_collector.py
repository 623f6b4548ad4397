"""A fake OpenTelemetry collector: a real OTLP/HTTP server on a loopback port, in a thread
of its own, that keeps what it receives.

`POST /v1/traces` takes an `ExportTraceServiceRequest` in protobuf (gzip too), decoded
with opentelemetry-proto's own classes, and answers 200 with an empty
`ExportTraceServiceResponse`; any other path is 404. `exports` keeps each request's raw
bytes and headers (to search for what must never be exported), `spans()` the spans
decoded.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

# opentelemetry.proto.trace.v1.Span.SpanKind and Status.StatusCode
KIND_INTERNAL, KIND_SERVER, KIND_CLIENT = 1, 2, 3
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2


@dataclass
class Export:
    path: str
    headers: dict[str, str]
    body: bytes  # as decoded from its content-encoding: the protobuf bytes


@dataclass
class Span:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root
    name: str
    kind: int
    attributes: dict[str, object]
    status_code: int
    status_message: str
    start_ns: int
    end_ns: int
    resource: dict[str, object]
    events: list[str]


def _value(value: AnyValue) -> object:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which) if which else None


def decode_spans(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    Span(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        name=span.name,
                        kind=span.kind,
                        attributes={kv.key: _value(kv.value) for kv in span.attributes},
                        status_code=span.status.code,
                        status_message=span.status.message,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        resource=resource,
                        events=[event.name for event in span.events],
                    )
                )
    return spans


class FakeCollector:
    """Start with `.start()` (or `with`); `.url` is the base OTLP endpoint."""

    def __init__(self) -> None:
        self.exports: list[Export] = []
        self.refused_paths: list[str] = []
        self._lock = threading.Lock()

    def start(self) -> FakeCollector:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    collector.refused_paths.append(self.path)
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                decode_spans(body)  # one that does not decode: the connection closes, unkept
                headers = {k.lower(): v for k, v in self.headers.items()}
                with collector._lock:
                    collector.exports.append(Export(self.path, headers, body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> FakeCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def raw(self) -> bytes:
        """Every export's bytes, joined: to search for what must never be in one."""
        with self._lock:
            return b"".join(export.body for export in self.exports)

    def spans(self) -> list[Span]:
        with self._lock:
            bodies = [export.body for export in self.exports]
        return [span for body in bodies for span in decode_spans(body)]

    def wait_for(self, found: Callable[[list[Span]], bool], timeout_s: float = 10) -> list[Span]:
        """The spans received, once `found(spans)` holds (AssertionError after timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if found(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"the collector did not get the spans: {spans}")
            time.sleep(0.05)
