"""Every row of the spec's "Authentication failures" table and every rule of "Sending the
key", against a real `gateway serve`, with keys and projects administered by the real CLI."""

import time
from datetime import UTC, datetime, timedelta

import pytest

from model_gateway.gateway.access import keys
from tests.support.errors import assert_error, without_request_id
from tests.support.gateway_process import CliFailed
from tests.support.http import bearer, chat_body

ALL_SCOPES = "inference,sandboxes,receipts"


def models(http, headers=None, **kwargs):
    return http.get("/v1/models", headers=headers or {}, **kwargs)


def chat(http, key, body, path="/v1/chat/completions"):
    return http.post(path, headers=bearer(key), json=body)


# -- 401 invalid_api_key ------------------------------------------------------------------


def test_no_key_is_invalid_api_key(http):
    assert_error(models(http), 401, "invalid_api_key", param=None)
    assert_error(http.get("/v1"), 401, "invalid_api_key")
    assert_error(http.get("/v1/receipts/rcpt_0"), 401, "invalid_api_key")


def test_no_key_on_an_inference_endpoint_is_invalid_api_key(http):
    assert_error(http.post("/v1/chat/completions", json=chat_body()), 401, "invalid_api_key")
    assert_error(
        http.post("/v1/responses", json={"model": "echo-1", "input": "hi"}), 401, "invalid_api_key"
    )


def expiring_key(gateway, project: str, scopes: str) -> str:
    """A key that expired a moment ago (the CLI refuses an expiry already past: on a busy
    machine its start-up alone can outlast a short one, so a longer one is tried next)."""
    for seconds in (1.5, 5, 15):
        expires = datetime.now(UTC) + timedelta(seconds=seconds)
        try:
            key = gateway.create_key(project, scopes, "--expires-at", expires.isoformat())
        except CliFailed as refused:
            if "in the past" not in str(refused):
                raise
            continue
        time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.1)
        return key
    raise AssertionError("the CLI refused every expiry as past")


def test_malformed_unknown_revoked_expired_and_missing_keys_are_indistinguishable(
    gateway, http, make_key
):
    project, valid = make_key(ALL_SCOPES)
    revoked = gateway.create_key(project, ALL_SCOPES)
    assert models(http, bearer(revoked)).status_code == 200  # usable, and now cached
    gateway.cli("keys", "revoke", keys.public_prefix(revoked))
    expired = expiring_key(gateway, project, ALL_SCOPES)
    cases = {
        "unknown": bearer(keys.generate_key()),
        "known prefix, wrong secret": bearer(valid[:18] + keys.generate_key()[18:]),
        "malformed": bearer("proj_live_not-a-key"),
        "truncated": bearer(valid[:-1]),
        "wrong product prefix": bearer("sk-" + valid[10:]),
        "revoked": bearer(revoked),
        "expired": bearer(expired),
        "revoked via x-api-key": {"x-api-key": revoked},
        "missing": {},
    }
    bodies, header_sets = {}, {}
    for name, headers in cases.items():
        response = models(http, headers)
        assert_error(response, 401, "invalid_api_key", param=None)
        bodies[name] = without_request_id(response)
        header_sets[name] = sorted(
            (k, v) for k, v in response.headers.items() if k not in ("x-request-id", "date")
        )
    assert len(set(bodies.values())) == 1, bodies
    assert len({tuple(h) for h in header_sets.values()}) == 1, header_sets
    assert models(http, bearer(valid)).status_code == 200


def test_an_expired_key_is_refused_and_a_future_expiry_is_not(gateway, http, make_key):
    project, _ = make_key()
    past = expiring_key(gateway, project, "inference")
    future = gateway.create_key(project, "inference", "--expires-at", "2999-01-01T00:00:00Z")
    assert_error(models(http, bearer(past)), 401, "invalid_api_key")
    assert models(http, bearer(future)).status_code == 200


def test_a_revocation_by_the_cli_counts_from_the_very_next_request(gateway, http, make_key):
    _, key = make_key(ALL_SCOPES)
    for _ in range(3):  # warm every cache there is
        assert models(http, bearer(key)).status_code == 200
    shown = gateway.cli("keys", "revoke", keys.public_prefix(key))
    assert shown["state"] == "revoked"
    assert_error(models(http, bearer(key)), 401, "invalid_api_key")
    assert_error(models(http, {"x-api-key": key}), 401, "invalid_api_key")


# -- 403 forbidden: archived project ------------------------------------------------------


def test_an_archive_by_the_cli_makes_the_projects_keys_forbidden_from_the_next_request(
    gateway, http, make_key
):
    project, key = make_key(ALL_SCOPES)
    other = gateway.create_key(project, "agents")
    assert models(http, bearer(key)).status_code == 200
    assert gateway.cli("projects", "archive", project)["state"] == "archived"
    assert_error(models(http, bearer(key)), 403, "forbidden")
    assert_error(models(http, {"x-api-key": other}), 403, "forbidden")
    assert_error(http.get("/v1", headers=bearer(key)), 403, "forbidden")


def test_an_archived_projects_key_is_forbidden_on_inference_too(gateway, http, make_key):
    project, key = make_key()
    gateway.cli("projects", "archive", project)
    assert_error(chat(http, key, chat_body()), 403, "forbidden")


# -- 403 insufficient_scope ---------------------------------------------------------------


@pytest.fixture(scope="module")
def scoped(gateway):
    """Keys of one project, by scope set."""
    project = gateway.create_project("scopes")
    return {
        s: gateway.create_key(project, s)
        for s in ("inference,sandboxes", "sandboxes,receipts", "agents")
    }


def test_a_key_without_the_receipts_scope_cannot_read_receipts(http, scoped):
    response = http.get("/v1/receipts/rcpt_0", headers=bearer(scoped["inference,sandboxes"]))
    error = assert_error(response, 403, "insufficient_scope")
    assert "receipts" in error["message"]


def test_a_key_without_the_inference_scope_cannot_run_inference(http, scoped):
    key = scoped["sandboxes,receipts"]
    assert_error(chat(http, key, chat_body()), 403, "insufficient_scope")
    assert_error(
        chat(http, key, {"model": "echo-1", "input": "hi"}, "/v1/responses"),
        403,
        "insufficient_scope",
    )


def test_the_agents_scope_grants_nothing_on_scoped_endpoints(http, scoped):
    key = scoped["agents"]
    assert_error(http.get("/v1/receipts/rcpt_0", headers=bearer(key)), 403, "insufficient_scope")
    assert_error(chat(http, key, chat_body()), 403, "insufficient_scope")
    assert_error(
        chat(http, key, {"model": "echo-1", "input": "hi"}, "/v1/responses"),
        403,
        "insufficient_scope",
    )


def test_the_agents_scope_alone_is_a_valid_key_for_unscoped_endpoints(http, scoped):
    key = scoped["agents"]
    assert models(http, bearer(key)).status_code == 200
    assert http.get("/v1", headers=bearer(key)).status_code == 200


# -- 403 model_not_allowed / 404 model_not_found ------------------------------------------


@pytest.fixture(scope="module")
def restricted(gateway):
    """Inference keys that may not use echo-notools, each for its own reason."""
    allow = gateway.create_project("allow", "--allow-models", "echo-1,echo-off")
    exclude = gateway.create_project(
        "exclude", "--exclude-models", "echo-notools", "--balance", "5"
    )
    return {
        "key's models": gateway.create_key(exclude, "inference", "--models", "echo-1"),
        "project allowlist": gateway.create_key(allow),
        "project exclusions": gateway.create_key(exclude),
    }


@pytest.mark.parametrize("reason", ["key's models", "project allowlist", "project exclusions"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_a_model_outside_the_keys_or_projects_policy_is_model_not_allowed(
    http, restricted, reason, path
):
    body = (
        chat_body("echo-notools")
        if path.endswith("completions")
        else {"model": "echo-notools", "input": "hi"}
    )
    assert_error(chat(http, restricted[reason], body, path), 403, "model_not_allowed")


def test_a_key_restricted_to_a_model_may_use_that_model(http, restricted):
    response = chat(http, restricted["key's models"], chat_body("echo-1"))
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "echo-1"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_an_unknown_model_is_model_not_found(http, inference_key, path):
    body = (
        chat_body("no-such-model")
        if path.endswith("completions")
        else {"model": "no-such-model", "input": "hi"}
    )
    assert_error(chat(http, inference_key, body, path), 404, "model_not_found")


# -- Sending the key ----------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_the_bearer_scheme_name_is_case_insensitive(http, inference_key, scheme):
    response = models(http, bearer(inference_key, scheme))
    assert response.status_code == 200
    assert response.json()["object"] == "list"


def test_x_api_key_is_accepted_as_an_alternative(http, inference_key):
    assert models(http, {"x-api-key": inference_key}).status_code == 200


@pytest.mark.parametrize(
    "authorization",
    [
        "Basic dXNlcjpwYXNz",
        "Bearer",
        "Bearer not-a-key",
        "Token {key}",
        "{key}",
        "Bearer {key}{key}",
    ],
)
def test_a_present_authorization_header_is_the_only_one_considered(
    http, inference_key, authorization
):
    headers = {"authorization": authorization.format(key=inference_key), "x-api-key": inference_key}
    assert_error(models(http, headers), 401, "invalid_api_key")


def test_keys_in_the_query_string_are_ignored(http, inference_key):
    params = {
        "api_key": inference_key,
        "key": inference_key,
        "authorization": f"Bearer {inference_key}",
        "x-api-key": inference_key,
    }
    assert_error(models(http, params=params), 401, "invalid_api_key")
    assert models(http, bearer(inference_key), params={"api_key": "junk"}).status_code == 200


def test_session_cookies_are_not_accepted(http, inference_key):
    cookie = f"session={inference_key}; api_key={inference_key}; gateway_session=abc"
    assert_error(models(http, {"cookie": cookie}), 401, "invalid_api_key")
