"""One worker of `gateway serve --workers N` (gateway/ops/workers.py starts it): the whole
gateway, served by uvicorn on the listening socket the parent bound and passed down.

Its settings come on stdin as one JSON line (the config may name credentials' variables,
never in a command line): the config, the socket's descriptor, the run folder and its
index there. It prints `ready` on stdout once it serves. It dies with the parent
(PR_SET_PDEATHSIG, set by the parent when it starts it), and SIGTERM stops it as it stops
`gateway serve`: no new connections, in-flight requests and streams finish, then the
gateway's parts close (uvicorn's graceful shutdown).
"""

from __future__ import annotations

import socket
import sys
from decimal import Decimal
from pathlib import Path

import msgspec
import orjson

from model_gateway.gateway.config import Config, Micros, _decode_hook
from model_gateway.gateway.ops.worker_seat import WorkerSeat

READY = b"ready\n"
STARTUP_FAILED = 3  # as uvicorn exits when the app does not start


def config_builtins(config: Config) -> object:
    """The config as JSON's types, for a worker's settings."""
    return msgspec.to_builtins(config, enc_hook=_micros_as_text)


def _micros_as_text(value: object) -> object:
    """An amount as the config writes it (USD), which the config's decoder reads back."""
    if isinstance(value, Micros):
        return str(Decimal(int(value)).scaleb(-6))
    raise NotImplementedError


def run_child() -> None:
    import uvicorn

    from model_gateway.gateway.app import create_app
    from model_gateway.gateway.ops.logs import configure_logging
    from model_gateway.gateway.ops.secretfile import restrict_file_modes
    from model_gateway.gateway.ops.server import tune_garbage_collector, uvicorn_options

    settings = orjson.loads(sys.stdin.buffer.readline())
    config = msgspec.convert(settings["config"], Config, dec_hook=_decode_hook)
    seat = WorkerSeat(Path(settings["run_folder"]), settings["index"])
    listener = socket.socket(fileno=settings["fd"])
    restrict_file_modes()
    configure_logging(config.server.log_format)

    def started() -> None:
        tune_garbage_collector()
        sys.stdout.buffer.write(READY)
        sys.stdout.flush()

    app = create_app(config, on_started=started, seat=seat)
    server = uvicorn.Server(uvicorn.Config(app, **uvicorn_options(config)))
    server.run(sockets=[listener])
    if not server.started:
        raise SystemExit(STARTUP_FAILED)


if __name__ == "__main__":
    run_child()
