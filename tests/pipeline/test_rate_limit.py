from model_gateway.gateway.access import keys
from model_gateway.pipeline.endpoint import ANY_VALID_KEY, Endpoint
from model_gateway.pipeline.gcra import Gcra
from model_gateway.pipeline.rate_limit import RateLimit
from model_gateway.pipeline.request_id import RequestId
from model_gateway.storage.base import KeyRecord, ProjectRecord
from tests.support.asgi import Recorder, WithContext, call
from tests.support.errors import assert_error


async def _handler(ctx):
    raise AssertionError("not called")


MODELS = Endpoint("GET", "/v1/models", ANY_VALID_KEY, _handler)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000  # milliseconds

    def __call__(self) -> int:
        return self.now


def key(id_="key_1", rpm=None) -> KeyRecord:
    return KeyRecord(
        id=id_,
        prefix="proj_live_" + id_[-8:].rjust(8, "x"),
        key_hash=b"h",
        project_id="prj_1",
        scopes=keys.parse_scopes("inference"),
        rpm=rpm,
    )


def project(rpm=None) -> ProjectRecord:
    return ProjectRecord(id="prj_1", name="p", rpm=rpm)


def stage(limiter, default_key_rpm=100, default_project_rpm=100):
    inner = Recorder()
    limit = RateLimit(
        inner,
        limiter=limiter,
        default_key_rpm=default_key_rpm,
        default_project_rpm=default_project_rpm,
    )
    return limit, inner


def app_for(limit, key_, project_):
    return RequestId(WithContext(limit, endpoint=MODELS, key=key_, project=project_))


async def test_a_keys_rpm_is_enforced_with_retry_after():
    clock = Clock()
    limit, inner = stage(Gcra(clock))
    app = app_for(limit, key(rpm=3), project())
    for _ in range(3):
        assert (await call(app)).status_code == 200
    reply = await call(app)
    error = assert_error(reply, 429, "rate_limit_exceeded")
    assert error["retry_after_seconds"] >= 1
    assert int(reply.headers["retry-after"]) == error["retry_after_seconds"]
    assert len(inner.calls) == 3


async def test_the_wait_is_over_after_retry_after_seconds():
    clock = Clock()
    limit, _ = stage(Gcra(clock))
    app = app_for(limit, key(rpm=2), project())
    for _ in range(2):
        assert (await call(app)).status_code == 200
    refused = await call(app)
    wait = refused.json()["error"]["retry_after_seconds"]
    assert wait <= 30  # one request refills every 60/rpm seconds
    clock.now += wait * 1000
    assert (await call(app)).status_code == 200


async def test_a_projects_rpm_is_shared_by_its_keys():
    clock = Clock()
    limit, _ = stage(Gcra(clock))
    a = app_for(limit, key("key_aaaaaaaa"), project(rpm=2))
    b = app_for(limit, key("key_bbbbbbbb"), project(rpm=2))
    assert (await call(a)).status_code == 200
    assert (await call(b)).status_code == 200
    assert_error(await call(a), 429, "rate_limit_exceeded")
    assert_error(await call(b), 429, "rate_limit_exceeded")


async def test_a_request_refused_by_one_bucket_takes_nothing_from_the_other():
    clock = Clock()
    limit, _ = stage(Gcra(clock))
    tight = app_for(limit, key("key_tttttttt", rpm=1), project(rpm=3))
    other = app_for(limit, key("key_oooooooo"), project(rpm=3))
    assert (await call(tight)).status_code == 200
    for _ in range(5):
        assert_error(await call(tight), 429, "rate_limit_exceeded")
    # The refusals above cost the project nothing: two of its three remain.
    assert (await call(other)).status_code == 200
    assert (await call(other)).status_code == 200
    assert_error(await call(other), 429, "rate_limit_exceeded")


async def test_the_configured_defaults_apply_when_neither_sets_an_rpm():
    clock = Clock()
    limit, _ = stage(Gcra(clock), default_key_rpm=2, default_project_rpm=50)
    app = app_for(limit, key(), project())
    assert (await call(app)).status_code == 200
    assert (await call(app)).status_code == 200
    assert_error(await call(app), 429, "rate_limit_exceeded")


async def test_a_console_session_counts_against_the_project_only():
    clock = Clock()
    limit, inner = stage(Gcra(clock), default_key_rpm=1, default_project_rpm=100)
    app = app_for(limit, None, project(rpm=2))
    assert (await call(app)).status_code == 200
    assert (await call(app)).status_code == 200
    assert_error(await call(app), 429, "rate_limit_exceeded")
    assert len(inner.calls) == 2
