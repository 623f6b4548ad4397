"""GET /healthz: liveness that includes the storage the gateway cannot work without."""

from __future__ import annotations

import pytest

from model_gateway.gateway.app import create_app, open_gateway
from model_gateway.gateway.config import parse_config
from model_gateway.pipeline.errors import ServiceUnavailable


async def test_healthz_is_503_once_storage_stops_answering(tmp_path):
    config = parse_config('[providers.local]\nkind = "echo"\n', base_dir=tmp_path)
    gateway = await open_gateway(config)
    [endpoint] = [ep for ep in gateway.routes.endpoints if ep.path == "/healthz"]
    try:
        assert (await endpoint.handler(None)).status_code == 200
        await gateway.storage.close()  # as if the database went away under the gateway
        with pytest.raises(ServiceUnavailable):
            await endpoint.handler(None)
    finally:
        await gateway.close()  # closing the storage again does nothing


async def test_a_stopped_gateway_app_does_not_start_again(tmp_path):
    """Its parts are closed (the spawned node's port among them): a request after the
    lifespan's end is refused, never a second, unowned gateway."""
    app = create_app(parse_config('[providers.local]\nkind = "echo"\n', base_dir=tmp_path))
    async with app.lifespan():
        assert app.gateway is not None
    assert app.gateway is None
    with pytest.raises(RuntimeError, match="stopped"):
        async with app.lifespan():
            pass
