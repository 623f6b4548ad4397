"""GET /healthz: liveness that includes the storage the gateway cannot work without."""

from __future__ import annotations

import pytest

from model_gateway.gateway.app import open_gateway
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
