from __future__ import annotations

import pytest

from tests.support.fake_openai import FakeOpenAI
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import NO_BREAKER, OPENAI_CREDENTIAL, UPSTREAM_ENV, inference_config


@pytest.fixture(scope="module")
def upstream():
    """An OpenAI-compatible upstream whose fault modes the billing tests need."""
    with FakeOpenAI(OPENAI_CREDENTIAL) as fake:
        yield fake


def metered_gateway(folder, upstream, *, timeout_s: float = 1.0) -> GatewayProcess:
    """A gateway in front of the fake, impatient enough that `slow` (3 s) times out."""
    return GatewayProcess(
        folder,
        extra_config=inference_config(upstream.url, upstream.url) + NO_BREAKER,
        env=UPSTREAM_ENV,
        gateway_timeout_s=timeout_s,
    )


@pytest.fixture(scope="module")
def gw(tmp_path_factory, upstream):
    with metered_gateway(tmp_path_factory.mktemp("billing"), upstream) as process:
        yield process
