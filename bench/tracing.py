"""What traces cost a request: two gateways on the same mock upstream, tracing off and on
(`[telemetry] otlp_endpoint` at a sink collector in this process, every request sampled:
the worst case), wrk rounds alternating off, on, off, on... (bench/paired.py's rounds and
report). CPU per request is the gateway process's, its exporter thread's included.

    python bench/tracing.py                     # chat, 32 connections, 5 rounds of 4 s
    python bench/tracing.py --scenario chat-stream --rounds 7
"""

from __future__ import annotations

import argparse
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gateway_target import start_gateway, start_mock
from paired import SCENARIOS, measure, report
from procs import Server


class SinkCollector:
    """An OTLP/HTTP endpoint that takes every export (200, an empty answer) and counts them."""

    def __init__(self) -> None:
        self.exports = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                sink.bytes += len(self.rfile.read(length))
                sink.exports += 1
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--scenario", choices=SCENARIOS, default="chat")
    parser.add_argument(
        "--gateway", type=Path, default=Path(__file__).parent.parent / ".venv/bin/gateway"
    )
    args = parser.parse_args()
    sink = SinkCollector()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        body = folder / "chat.json"
        body.write_bytes(SCENARIOS[args.scenario].data)
        servers: list[Server] = [start_mock(folder)]
        try:
            targets = []
            variants = (
                ("tracing off", ""),
                ("tracing on", f'[telemetry]\notlp_endpoint = "{sink.url}"\n'),
            )
            for name, extra in variants:
                upstream = servers[0].url + "/v1"
                server, key = start_gateway(
                    args.gateway, folder / name.replace(" ", "-"), upstream, True, extra
                )
                servers.append(server)
                targets.append((name, server, key))
            results = measure(args, targets, body, folder)
        finally:
            for server in reversed(servers):
                server.stop()  # the traced one exports what it still holds
            sink.stop()
    report(args, results)
    print(f"\nthe collector took {sink.exports:,} exports, {sink.bytes:,} bytes of spans")


if __name__ == "__main__":
    main()
