import secrets

import pytest

from model_gateway.gateway.access import keys
from model_gateway.gateway.access.keyring import KeyRing
from model_gateway.pipeline.key_auth import KeyAuth
from model_gateway.pipeline.request_id import RequestId
from model_gateway.storage import open_storage
from model_gateway.storage.base import now_s
from tests.support.asgi import Recorder, call
from tests.support.errors import assert_error, without_request_id
from tests.support.records import add_key, add_project


@pytest.fixture
async def db(tmp_path):
    url = f"sqlite:///{tmp_path}/gateway.db"
    storage = await open_storage(url)
    yield url, storage
    await storage.close()


@pytest.fixture
async def world(db):
    """A real SQLite database, a keyring over it, one project and one usable key."""
    url, storage = db
    pepper = secrets.token_bytes(32)
    project = await add_project(storage)
    key, record = await add_key(storage, pepper, project.id)
    inner = Recorder()
    app = RequestId(KeyAuth(inner, keys=KeyRing(storage, pepper)))
    return {
        "url": url,
        "storage": storage,
        "pepper": pepper,
        "project": project,
        "key": key,
        "record": record,
        "inner": inner,
        "app": app,
    }


def bearer(key: str, scheme: str = "Bearer") -> dict:
    return {"authorization": f"{scheme} {key}"}


async def test_a_valid_bearer_key_reaches_the_inner_app_with_key_and_project(world):
    reply = await call(world["app"], headers=bearer(world["key"]))
    assert reply.status_code == 200
    ctx = world["inner"].last.ctx
    assert ctx.key.prefix == world["record"].prefix
    assert ctx.project.id == world["project"].id


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "BeArEr"])
async def test_the_bearer_scheme_is_case_insensitive(world, scheme):
    reply = await call(world["app"], headers=bearer(world["key"], scheme))
    assert reply.status_code == 200


async def test_x_api_key_is_an_alternative(world):
    reply = await call(world["app"], headers={"x-api-key": world["key"]})
    assert reply.status_code == 200
    assert world["inner"].last.ctx.key.id == world["record"].id


async def test_no_key_is_invalid_api_key(world):
    reply = await call(world["app"])
    assert_error(reply, 401, "invalid_api_key", param=None)
    assert not world["inner"].called


@pytest.mark.parametrize(
    "authorization",
    [
        "Basic dXNlcjpwYXNz",
        "Bearer",
        "Bearer ",
        "Token {key}",
        "{key}",
        "Bearer{key}",
        "Bearer proj_live_short",
        "Bearer {key}x",
    ],
)
async def test_a_malformed_authorization_is_not_retried_against_x_api_key(world, authorization):
    headers = [
        ("authorization", authorization.format(key=world["key"])),
        ("x-api-key", world["key"]),
    ]
    reply = await call(world["app"], headers=headers)
    assert_error(reply, 401, "invalid_api_key")
    assert not world["inner"].called


async def test_two_authorization_headers_are_refused(world):
    headers = [("authorization", f"Bearer {world['key']}"), ("authorization", "Bearer x")]
    reply = await call(world["app"], headers=headers)
    assert_error(reply, 401, "invalid_api_key")


async def test_keys_in_the_query_string_or_cookies_are_ignored(world):
    key = world["key"]
    query = await call(world["app"], query_string=f"api_key={key}&key={key}".encode())
    assert_error(query, 401, "invalid_api_key")
    cookie = await call(world["app"], headers={"cookie": f"session={key}; api_key={key}"})
    assert_error(cookie, 401, "invalid_api_key")
    assert not world["inner"].called


async def test_unknown_malformed_revoked_expired_and_missing_keys_are_indistinguishable(world):
    storage, pepper, project = world["storage"], world["pepper"], world["project"]
    revoked, record = await add_key(storage, pepper, project.id)
    await storage.revoke_key(record.prefix)
    expired, _ = await add_key(storage, pepper, project.id, expires_at=now_s() - 1)
    valid = world["key"]
    candidates = {
        "unknown": keys.generate_key(),
        "known prefix, wrong secret": valid[:18] + keys.generate_key()[18:],
        "malformed": "proj_live_" + "!" * 32,
        "too short": valid[:-1],
        "revoked": revoked,
        "expired": expired,
    }
    bodies = {}
    for name, key in candidates.items():
        reply = await call(world["app"], headers=bearer(key))
        assert_error(reply, 401, "invalid_api_key")
        bodies[name] = without_request_id(reply)
    missing = await call(world["app"])
    bodies["missing"] = without_request_id(missing)
    assert len(set(bodies.values())) == 1, bodies
    assert not world["inner"].called


async def test_a_key_that_expires_later_is_usable(world):
    storage, pepper, project = world["storage"], world["pepper"], world["project"]
    later, _ = await add_key(storage, pepper, project.id, expires_at=now_s() + 3600)
    assert (await call(world["app"], headers=bearer(later))).status_code == 200


async def test_the_hash_depends_on_the_pepper(world):
    other = RequestId(KeyAuth(Recorder(), keys=KeyRing(world["storage"], b"p" * 32)))
    reply = await call(other, headers=bearer(world["key"]))
    assert_error(reply, 401, "invalid_api_key")


async def test_an_archived_projects_key_is_forbidden(world):
    await world["storage"].archive_project(world["project"].id)
    reply = await call(world["app"], headers=bearer(world["key"]))
    assert_error(reply, 403, "forbidden")
    assert not world["inner"].called


async def test_a_revocation_by_another_connection_counts_from_the_next_request(world):
    assert (await call(world["app"], headers=bearer(world["key"]))).status_code == 200  # cached
    other = await open_storage(world["url"])  # as the CLI would, in its own process
    try:
        await other.revoke_key(world["record"].prefix)
    finally:
        await other.close()
    reply = await call(world["app"], headers=bearer(world["key"]))
    assert_error(reply, 401, "invalid_api_key")


async def test_an_archive_by_another_connection_counts_from_the_next_request(world):
    assert (await call(world["app"], headers=bearer(world["key"]))).status_code == 200  # cached
    other = await open_storage(world["url"])
    try:
        await other.archive_project(world["project"].id)
    finally:
        await other.close()
    reply = await call(world["app"], headers=bearer(world["key"]))
    assert_error(reply, 403, "forbidden")
