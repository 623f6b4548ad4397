"""Real gateways (`gateway serve` subprocesses) in front of real fake upstreams.

Every provider kind is configured, each model named `<provider>/<mode>` where the mode is
the upstream model name that selects the fake's behaviour (see fake_upstream).
"""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_openai import OPENAI_MODES, FakeOpenAI
from tests.support.fake_upstream import BROKEN_USAGE_MODES, MALFORMED
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import (
    ANTHROPIC_CREDENTIAL,
    IMPATIENT_TIMEOUT_S,
    NO_BREAKER,
    OPENAI_CREDENTIAL,
    UPSTREAM_ENV,
    _model,
    inference_config,
)

# Fault modes of the fakes beyond tests.support.inference.MODES, served as the same
# `<provider>/<mode>` models.
MORE_MODES = [
    "stall-after-accept",
    "stall-before-first",
    "done-then-hang",
    MALFORMED,
    *BROKEN_USAGE_MODES,
    *OPENAI_MODES,
]
PROVIDERS = {"oa": "fakeai", "oa-chat": "fakeai-chatonly", "an": "fakeanthropic"}


def _config(openai_url: str, anthropic_url: str) -> str:
    config = inference_config(openai_url, anthropic_url)
    config += NO_BREAKER
    for prefix, provider in PROVIDERS.items():
        config += "".join(_model(f"{prefix}/{mode}", provider, mode) for mode in MORE_MODES)
    return config


@pytest.fixture(scope="session")
def fake_openai():
    with FakeOpenAI(OPENAI_CREDENTIAL) as fake:
        yield fake


@pytest.fixture(scope="session")
def fake_anthropic():
    with FakeAnthropic(ANTHROPIC_CREDENTIAL) as fake:
        yield fake


def _start(folder, fakes, timeout_s: float) -> GatewayProcess:
    fake_openai, fake_anthropic = fakes
    return GatewayProcess(
        folder,
        extra_config=_config(fake_openai.url, fake_anthropic.url),
        env=UPSTREAM_ENV,
        gateway_timeout_s=timeout_s,
    ).start()


@pytest.fixture(scope="session")
def gw(tmp_path_factory, fake_openai, fake_anthropic):
    """The gateway under test, with the default-like timeout."""
    process = _start(tmp_path_factory.mktemp("inference"), (fake_openai, fake_anthropic), 30)
    yield process
    process.stop()


@pytest.fixture(scope="session")
def impatient_gw(tmp_path_factory, fake_openai, fake_anthropic):
    """The same configuration with a gateway timeout shorter than the fake's slowness."""
    folder = tmp_path_factory.mktemp("impatient")
    process = _start(folder, (fake_openai, fake_anthropic), IMPATIENT_TIMEOUT_S)
    yield process
    process.stop()


def _key(process: GatewayProcess) -> str:
    project = process.cli("projects", "create", "inference", "--balance", "1000")["id"]
    return process.create_key(project, "inference,receipts")


@pytest.fixture(scope="session")
def key(gw) -> str:
    return _key(gw)


@pytest.fixture(scope="session")
def impatient_key(impatient_gw) -> str:
    return _key(impatient_gw)


@pytest.fixture(scope="session")
def client(gw, key) -> openai.OpenAI:
    """The official SDK, pointed at the gateway; no retries, so each call is one request."""
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=20)


@pytest.fixture(scope="session")
def http(gw, key):
    with httpx.Client(
        base_url=gw.url, headers={"authorization": f"Bearer {key}"}, timeout=20
    ) as session:
        yield session


@pytest.fixture(scope="session")
def impatient_http(impatient_gw, impatient_key):
    with httpx.Client(
        base_url=impatient_gw.url,
        headers={"authorization": f"Bearer {impatient_key}"},
        timeout=20,
    ) as session:
        yield session
