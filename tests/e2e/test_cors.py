"""CORS against a real `gateway serve` whose config lists allowed origins."""

import httpx
import pytest

from tests.support.errors import assert_error
from tests.support.gateway_process import GatewayProcess
from tests.support.http import bearer, chat_body

ALLOWED = "https://app.example.com"
ALSO_ALLOWED = "http://localhost:5173"


@pytest.fixture(scope="module")
def cors_gateway(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cors")
    with GatewayProcess(folder, cors_origins=[ALLOWED, ALSO_ALLOWED]) as process:
        project = process.create_project("cors")
        process.key = process.create_key(project, "inference")
        yield process


@pytest.fixture(scope="module")
def client(cors_gateway):
    with httpx.Client(base_url=cors_gateway.url, timeout=30) as c:
        yield c


def cors_of(response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.startswith("access-control-")}


def preflight(client, origin, path="/v1/chat/completions", method="POST"):
    return client.options(
        path,
        headers={
            "origin": origin,
            "access-control-request-method": method,
            "access-control-request-headers": "authorization, content-type",
        },
    )


@pytest.mark.parametrize("origin", [ALLOWED, ALSO_ALLOWED])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/v1/responses"])
def test_a_preflight_from_an_allowed_origin_is_answered(client, origin, path):
    response = preflight(client, origin, path)
    assert response.status_code in (200, 204)
    assert cors_of(response) == {
        "access-control-allow-origin": origin,
        "access-control-allow-methods": "GET, POST, OPTIONS",
        "access-control-allow-headers": (
            "authorization, content-type, x-api-key, anthropic-version, anthropic-beta"
        ),
        "access-control-max-age": "600",
    }
    assert "access-control-allow-credentials" not in response.headers
    assert response.headers["x-request-id"].startswith("req_")


def test_an_actual_request_from_an_allowed_origin_exposes_the_ids(client, cors_gateway):
    response = client.get("/v1/models", headers={**bearer(cors_gateway.key), "origin": ALLOWED})
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == ALLOWED
    exposed = {h.strip() for h in response.headers["access-control-expose-headers"].split(",")}
    assert exposed == {"x-request-id", "x-receipt-id"}
    assert "access-control-allow-credentials" not in response.headers


def test_an_error_to_an_allowed_origin_is_readable_by_the_browser(client):
    response = client.post("/v1/chat/completions", json=chat_body(), headers={"origin": ALLOWED})
    assert_error(response, 401, "invalid_api_key")
    assert response.headers["access-control-allow-origin"] == ALLOWED
    assert "x-request-id" in response.headers["access-control-expose-headers"]


@pytest.mark.parametrize(
    "origin",
    [
        "https://evil.example",
        "https://app.example.com.evil.example",
        "http://app.example.com",
        "https://app.example.com:444",
        "null",
    ],
)
def test_other_origins_get_no_cors_headers_at_all(client, cors_gateway, origin):
    pre = preflight(client, origin)
    assert cors_of(pre) == {}
    assert_error(pre, 405, "method_not_allowed")  # an OPTIONS like any other
    actual = client.get("/v1/models", headers={**bearer(cors_gateway.key), "origin": origin})
    assert actual.status_code == 200
    assert cors_of(actual) == {}


def test_a_gateway_without_configured_origins_answers_no_browser(http, inference_key):
    # The shared gateway's config has `cors_origins = []`.
    assert cors_of(preflight(http, ALLOWED)) == {}
    actual = http.get("/v1/models", headers={**bearer(inference_key), "origin": ALLOWED})
    assert actual.status_code == 200
    assert cors_of(actual) == {}
