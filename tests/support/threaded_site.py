"""An aiohttp application served on loopback from a thread of its own, with its own event
loop: the fakes' servers (an upstream, an identity provider), which the tests' own code
calls synchronously or from other loops."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web


class ThreadedSite:
    def __init__(self, app: web.Application, name: str, **runner_options: Any) -> None:
        self._app, self._name, self._options = app, name, runner_options
        self.port = 0

    def start(self) -> int:
        """Serve on a free port of 127.0.0.1; the port."""
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def serve() -> None:
            self._runner = web.AppRunner(self._app, access_log=None, **self._options)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError(f"{self._name} did not start")
        return self.port

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
