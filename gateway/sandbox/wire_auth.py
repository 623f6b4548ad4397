"""HMAC-SHA256 authentication of gateway <-> sandbox node messages.

A request carries three headers:

    x-sandbox-timestamp  unix seconds, decimal
    x-sandbox-nonce      32 random hex characters, never accepted twice
    x-sandbox-signature  hex HMAC-SHA256(secret,
                             f"{timestamp}.{nonce}.request.{method} {path}.".encode() + body)

A response carries `x-sandbox-timestamp` and `x-sandbox-signature`, the MAC being
HMAC-SHA256(secret, f"{timestamp}.{request_nonce}.response.{status}.{retry_after}.".encode()
+ body), `retry_after` the header's value or empty: binding it to the request's nonce
means a recorded answer is worthless for any other request, and the `request` /
`response` tags mean one can never pass for the other. The request's method and path and
the response's status and retry-after are signed too: nobody on the way can send a job
to another endpoint, or turn a run's 200 into a failure (the code ran, unbilled) or a
busy node's wait into another.

Nonces are remembered in memory for twice the window. A node also refuses requests
timestamped before it started (`not_before`): a request captured while an earlier run
of the node was up cannot be replayed after a restart, though the new run never saw it.
"""

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path

from model_gateway.gateway.ops import secretfile

TIMESTAMP_HEADER = "x-sandbox-timestamp"
NONCE_HEADER = "x-sandbox-nonce"
SIGNATURE_HEADER = "x-sandbox-signature"
RETRY_AFTER_HEADER = "retry-after"  # a busy node's answer: signed with its status

MIN_SECRET_BYTES = 32
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_NONCE = re.compile(r"[0-9a-f]{32}")
_SIGNATURE = re.compile(r"[0-9a-f]{64}")


class SignatureError(Exception):
    """A message failed authentication; the text says why, never what the secret is."""


class Signer:
    """Signs and verifies both directions; remembers request nonces to refuse replays.

    Not thread-safe: the node calls it from its event loop only.
    """

    def __init__(
        self,
        secret: bytes,
        *,
        window_s: int = 30,
        max_nonces: int = 100_000,
        clock: Callable[[], float] = time.time,
        not_before: int | None = None,
    ) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"sandbox secret must be at least {MIN_SECRET_BYTES} bytes")
        self._secret = secret
        self._window_s = window_s
        self._max_nonces = max_nonces
        self._clock = clock
        # Nonces are remembered in memory only: a node refuses requests timestamped
        # before it started, so that one captured from its previous run cannot replay.
        self.not_before = not_before
        # nonce -> time after which its timestamp can no longer pass the window check;
        # insertion order is expiry order because expiry = arrival + 2 * window.
        self._seen: OrderedDict[str, float] = OrderedDict()

    def __repr__(self) -> str:
        return f"Signer(window_s={self._window_s})"  # never show the secret

    def sign_request(self, target: str, body: bytes) -> dict[str, str]:
        """`target`: the request's method and path, e.g. "POST /execute"."""
        timestamp = str(int(self._clock()))
        nonce = secrets.token_hex(16)
        return {
            TIMESTAMP_HEADER: timestamp,
            NONCE_HEADER: nonce,
            SIGNATURE_HEADER: self._mac(timestamp, nonce, f"request.{target}", body),
        }

    def verify_request(self, headers: Mapping[str, str], target: str, body: bytes) -> str:
        """Checks a request and returns its nonce, which its response must be bound to."""
        timestamp = self._fresh_timestamp(headers)
        nonce = _header(headers, NONCE_HEADER, _NONCE)
        self._check_mac(headers, self._mac(timestamp, nonce, f"request.{target}", body))
        if self.not_before is not None and int(timestamp) < self.not_before:
            raise SignatureError("request timestamped before this node started")
        self._remember(nonce)  # only after the MAC: forged nonces must not fill the cache
        return nonce

    def sign_response(
        self, status: int, body: bytes, request_nonce: str, retry_after: str = ""
    ) -> dict[str, str]:
        timestamp = str(int(self._clock()))
        outcome = f"response.{status}.{retry_after}"
        return {
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: self._mac(timestamp, request_nonce, outcome, body),
        }

    def verify_response(
        self, headers: Mapping[str, str], status: int, body: bytes, request_nonce: str
    ) -> None:
        timestamp = self._fresh_timestamp(headers)
        outcome = f"response.{status}.{headers.get(RETRY_AFTER_HEADER, '')}"
        self._check_mac(headers, self._mac(timestamp, request_nonce, outcome, body))

    def _mac(self, timestamp: str, nonce: str, direction: str, body: bytes) -> str:
        head = f"{timestamp}.{nonce}.{direction}.".encode()
        return hmac.new(self._secret, head + body, hashlib.sha256).hexdigest()

    def _fresh_timestamp(self, headers: Mapping[str, str]) -> str:
        timestamp = _header(headers, TIMESTAMP_HEADER, _TIMESTAMP)
        if abs(self._clock() - int(timestamp)) > self._window_s:
            raise SignatureError("timestamp outside the accepted window")
        return timestamp

    def _check_mac(self, headers: Mapping[str, str], expected: str) -> None:
        given = _header(headers, SIGNATURE_HEADER, _SIGNATURE)
        if not hmac.compare_digest(given, expected):
            raise SignatureError("bad signature")

    def _remember(self, nonce: str) -> None:
        now = self._clock()
        while self._seen and next(iter(self._seen.values())) <= now:
            self._seen.popitem(last=False)
        if nonce in self._seen:
            raise SignatureError("replayed nonce")
        if len(self._seen) >= self._max_nonces:
            # Forgetting a live nonce would allow a replay: refuse instead.
            raise SignatureError("too many requests in the replay window")
        self._seen[nonce] = now + 2 * self._window_s


def well_formed_nonce(value: str) -> bool:
    return _NONCE.fullmatch(value) is not None


def _header(headers: Mapping[str, str], name: str, pattern: re.Pattern[str]) -> str:
    value = headers.get(name)
    if value is None:
        raise SignatureError(f"missing {name} header")
    if not pattern.fullmatch(value):
        raise SignatureError(f"malformed {name} header")
    return value


def load_shared_secret(path: str | os.PathLike[str]) -> bytes:
    """Returns the shared secret stored at `path`, creating it (0600, 64 hex chars) if missing.

    The key is the file's text without surrounding whitespace, so an operator may
    also provide any string of at least 32 characters.
    """
    path = Path(path)
    if not path.exists():
        # O_EXCL: a concurrent creator wins, and its file may not be written yet when
        # secretfile reads it back (ValueError): the loop below waits for it.
        with contextlib.suppress(ValueError):
            secretfile.load_or_create_secret(path, 32)
    secret = path.read_bytes().strip()
    # The gateway and a node may start together: the other one may be between creating
    # the file and writing it (one write of 65 bytes), so an empty file is read again.
    deadline = time.monotonic() + 1.0
    while not secret and time.monotonic() < deadline:
        time.sleep(0.01)
        secret = path.read_bytes().strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"{path}: the secret must be at least {MIN_SECRET_BYTES} characters")
    return secret
