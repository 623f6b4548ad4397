"""What every provider kind's test module shares: on its module's gateway (`gw`), a funded
project's key with the inference and receipts scopes, the official openai SDK and an
httpx client with that key."""

from __future__ import annotations

import httpx
import openai
import pytest


@pytest.fixture(scope="module")
def key(request, gw) -> str:
    name = request.module.__name__.rpartition(".")[2].removeprefix("test_")
    project = gw.cli("projects", "create", name, "--balance", "1000")["id"]
    return gw.create_key(project, "inference,receipts")


@pytest.fixture(scope="module")
def client(gw, key) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=20)


@pytest.fixture(scope="module")
def http(gw, key):
    headers = {"authorization": f"Bearer {key}"}
    with httpx.Client(base_url=gw.url, headers=headers, timeout=20) as session:
        yield session
