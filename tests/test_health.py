"""GET /healthz: liveness that includes the storage the gateway cannot work without."""

from __future__ import annotations

import pytest

from model_gateway.gateway.api import CoreHandlers
from model_gateway.gateway.app import Gateway
from model_gateway.gateway.config import parse_config
from model_gateway.pipeline.errors import ServiceUnavailable


async def test_healthz_is_503_once_storage_stops_answering(tmp_path):
    gateway = Gateway(parse_config('[providers.local]\nkind = "echo"\n', base_dir=tmp_path))
    await gateway.start()
    healthz = CoreHandlers(gateway).healthz
    try:
        assert (await healthz(None)).status_code == 200
        await gateway.storage.close()  # as if the database went away under the gateway
        with pytest.raises(ServiceUnavailable):
            await healthz(None)
    finally:
        gateway.storage = None  # already closed
        await gateway.stop()
