from __future__ import annotations

import itertools

import pytest

from tests.console.support import ConsoleClient, create_user
from tests.support.gateway_process import GatewayProcess

_emails = itertools.count()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """A console-serving gateway; its first user (the owner) is owner@example.com."""
    with GatewayProcess(tmp_path_factory.mktemp("console")) as process:
        create_user(process, "owner@example.com")
        yield process


@pytest.fixture
def owner(gateway):
    client = ConsoleClient(gateway)
    assert client.login("owner@example.com").status_code == 200
    yield client
    client.close()


@pytest.fixture
def member_email(gateway) -> str:
    email = f"member{next(_emails)}@example.com"
    create_user(gateway, email)
    return email


@pytest.fixture
def member(gateway, member_email):
    client = ConsoleClient(gateway)
    assert client.login(member_email).status_code == 200
    yield client
    client.close()


@pytest.fixture
def project(owner) -> dict:
    response = owner.post("/console/api/projects", {"name": "console-test"})
    assert response.status_code == 201, response.text
    return response.json()


@pytest.fixture
def funded(gateway, owner, project) -> dict:
    """A project with 5 USD, recorded as a payment."""
    reference = f"INV-{next(_emails)}"
    paid = owner.post(
        f"/console/api/projects/{project['id']}/payments",
        {"amount": "5", "reference": reference},
    )
    assert paid.status_code == 201, paid.text
    return project
