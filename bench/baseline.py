"""The bare pass-through: the floor the gateway is measured against.

One uvicorn process (uvloop + httptools), two Starlette routes, one pooled aiohttp
ClientSession created at startup, orjson to read `stream` from the request. No
auth, no metering, no stages: the request body goes upstream as is and the answer
comes back as is, streams relayed chunk by chunk.

    python bench/baseline.py --port 9102 --upstream http://127.0.0.1:9101/v1

The upstream credential is read from BENCH_UPSTREAM_KEY, like the gateway's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator

import aiohttp
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def create_app(upstream: str) -> Starlette:
    headers = {
        "content-type": "application/json",
        "authorization": "Bearer " + os.environ.get("BENCH_UPSTREAM_KEY", ""),
    }

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=512, keepalive_timeout=60)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=120)
        ) as app.state.session:
            yield

    async def forward(request: Request) -> Response:
        body = await request.body()
        stream = orjson.loads(body).get("stream") is True
        url = upstream + request.url.path.removeprefix("/v1")
        session: aiohttp.ClientSession = request.app.state.session
        answer = await session.post(url, data=body, headers=headers)
        if not stream:
            async with answer:
                return Response(await answer.read(), answer.status, media_type=answer.content_type)
        return StreamingResponse(relay(answer), answer.status, media_type="text/event-stream")

    async def relay(answer: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        async with answer:
            async for chunk in answer.content.iter_any():
                yield chunk

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", forward, methods=["POST"]),
            Route("/v1/responses", forward, methods=["POST"]),
            Route("/healthz", healthz),
        ],
        lifespan=lifespan,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9102)
    parser.add_argument("--upstream", default="http://127.0.0.1:9101/v1")
    args = parser.parse_args()
    uvicorn.run(
        create_app(args.upstream.rstrip("/")),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
