import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_gateway.gateway.sandbox.wire_auth import (
    NONCE_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SignatureError,
    Signer,
    load_shared_secret,
)

SECRET = b"k" * 32
TARGET = "POST /execute"
BODY = b'{"runtime":"python","code":"print(1)"}'


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def signer(clock: Clock) -> Signer:
    return Signer(SECRET, window_s=30, clock=clock)


def test_signed_request_verifies_and_returns_its_nonce(signer):
    headers = signer.sign_request(TARGET, BODY)
    assert signer.verify_request(headers, TARGET, BODY) == headers[NONCE_HEADER]


@pytest.mark.parametrize("header", [TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER])
def test_tampered_header_is_rejected(signer, header):
    headers = signer.sign_request(TARGET, BODY)
    value = headers[header]
    headers[header] = value[:-1] + ("0" if value[-1] != "0" else "1")
    with pytest.raises(SignatureError):
        signer.verify_request(headers, TARGET, BODY)


@pytest.mark.parametrize("header", [TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER])
def test_missing_header_is_rejected(signer, header):
    headers = signer.sign_request(TARGET, BODY)
    del headers[header]
    with pytest.raises(SignatureError, match="missing"):
        signer.verify_request(headers, TARGET, BODY)


@given(body=st.binary(max_size=200), data=st.data())
def test_any_change_to_the_body_is_rejected(body, data):
    signer = Signer(SECRET)
    headers = signer.sign_request(TARGET, body)
    tampered = data.draw(st.binary(max_size=200).filter(lambda b: b != body))
    with pytest.raises(SignatureError, match="bad signature"):
        signer.verify_request(headers, TARGET, tampered)


@pytest.mark.parametrize("skew", [-31, 31])
def test_stale_or_future_timestamp_is_rejected(signer, clock, skew):
    headers = signer.sign_request(TARGET, BODY)
    clock.now += skew
    with pytest.raises(SignatureError, match="window"):
        signer.verify_request(headers, TARGET, BODY)


def test_replayed_request_is_rejected(signer):
    headers = signer.sign_request(TARGET, BODY)
    signer.verify_request(headers, TARGET, BODY)
    with pytest.raises(SignatureError, match="replayed"):
        signer.verify_request(headers, TARGET, BODY)


def test_wrong_secret_is_rejected(clock):
    headers = Signer(b"x" * 32, clock=clock).sign_request(TARGET, BODY)
    with pytest.raises(SignatureError, match="bad signature"):
        Signer(SECRET, clock=clock).verify_request(headers, TARGET, BODY)


def test_response_is_bound_to_its_request(signer):
    request_nonce = signer.verify_request(signer.sign_request(TARGET, BODY), TARGET, BODY)
    other_nonce = signer.sign_request(TARGET, BODY)[NONCE_HEADER]
    response = signer.sign_response(200, b'{"status":"completed"}', request_nonce)
    signer.verify_response(response, 200, b'{"status":"completed"}', request_nonce)
    with pytest.raises(SignatureError, match="bad signature"):
        signer.verify_response(response, 200, b'{"status":"completed"}', other_nonce)
    with pytest.raises(SignatureError, match="bad signature"):
        signer.verify_response(response, 200, b'{"status":"failed"}', request_nonce)


def test_a_request_is_bound_to_its_method_and_path(signer):
    headers = signer.sign_request("POST /execute", BODY)
    with pytest.raises(SignatureError, match="bad signature"):
        signer.verify_request(headers, "POST /stop", BODY)  # sent on to another endpoint


def test_a_response_is_bound_to_its_status_and_retry_after(signer):
    """Nobody on the way can turn a run's 200 into a failure (the code ran, unbilled), or
    a busy node's wait into another."""
    nonce = signer.verify_request(signer.sign_request(TARGET, BODY), TARGET, BODY)
    ran = signer.sign_response(200, BODY, nonce)
    with pytest.raises(SignatureError, match="bad signature"):
        signer.verify_response(ran, 502, BODY, nonce)
    busy = signer.sign_response(503, BODY, nonce, "5")
    signer.verify_response({**busy, "retry-after": "5"}, 503, BODY, nonce)
    for headers in (busy, {**busy, "retry-after": "3600"}):
        with pytest.raises(SignatureError, match="bad signature"):
            signer.verify_response(headers, 503, BODY, nonce)


def test_request_and_response_signatures_cannot_stand_for_each_other(signer):
    request = signer.sign_request(TARGET, BODY)
    with pytest.raises(SignatureError):
        signer.verify_response(request, 200, BODY, request[NONCE_HEADER])
    response = signer.sign_response(200, BODY, request[NONCE_HEADER])
    with pytest.raises(SignatureError):
        signer.verify_request({**response, NONCE_HEADER: request[NONCE_HEADER]}, TARGET, BODY)


def test_stale_response_is_rejected(signer, clock):
    response = signer.sign_response(200, BODY, "a" * 32)
    clock.now += 31
    with pytest.raises(SignatureError, match="window"):
        signer.verify_response(response, 200, BODY, "a" * 32)


def test_nonce_cache_is_bounded_and_refuses_rather_than_forgets(clock):
    signer = Signer(SECRET, window_s=30, max_nonces=2, clock=clock)
    for _ in range(2):
        signer.verify_request(signer.sign_request(TARGET, BODY), TARGET, BODY)
    with pytest.raises(SignatureError, match="too many"):
        signer.verify_request(signer.sign_request(TARGET, BODY), TARGET, BODY)
    clock.now += 61  # the remembered nonces' timestamps can no longer pass
    signer.verify_request(signer.sign_request(TARGET, BODY), TARGET, BODY)


def test_forged_requests_do_not_fill_the_nonce_cache(clock):
    signer = Signer(SECRET, max_nonces=1, clock=clock)
    forger = Signer(b"f" * 32, clock=clock)
    for _ in range(3):
        with pytest.raises(SignatureError, match="bad signature"):
            signer.verify_request(forger.sign_request(TARGET, BODY), TARGET, BODY)
    signer.verify_request(signer.sign_request(TARGET, BODY), TARGET, BODY)


def test_short_secret_is_refused():
    with pytest.raises(ValueError, match="at least 32"):
        Signer(b"short")


def test_secret_never_shows_in_repr():
    assert "k" * 8 not in repr(Signer(SECRET))


def test_secret_file_is_created_private_and_reused(tmp_path):
    path = tmp_path / "data" / "sandbox-secret"
    secret = load_shared_secret(path)
    assert len(secret) == 64 and bytes.fromhex(secret.decode())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_shared_secret(path) == secret
    assert [p.name for p in path.parent.iterdir()] == ["sandbox-secret"]


def test_operator_secret_is_used_as_written(tmp_path):
    path = tmp_path / "secret"
    path.write_text("  a passphrase of at least thirty-two chars \n")
    assert load_shared_secret(path) == b"a passphrase of at least thirty-two chars"
    path.write_text("too short")
    with pytest.raises(ValueError, match="at least 32"):
        load_shared_secret(path)


def test_requests_timestamped_before_the_node_started_are_refused(clock):
    captured = Signer(SECRET, clock=clock).sign_request(TARGET, BODY)
    clock.now += 5  # the node restarts: a new signer, with no memory of nonces
    restarted = Signer(SECRET, clock=clock, not_before=int(clock.now))
    with pytest.raises(SignatureError, match="before this node started"):
        restarted.verify_request(captured, TARGET, BODY)
    restarted.verify_request(restarted.sign_request(TARGET, BODY), TARGET, BODY)
