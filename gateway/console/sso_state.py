"""A single sign-on in progress, between /console/sso/start and its callback: its `state`,
`nonce`, PKCE verifier and redirect URI, sealed (PyNaCl's SecretBox: encrypted and
authenticated) in a cookie, so that every serving process and instance of the deployment
can finish what any of them began. The key derives from the keys' pepper, which they share.

Cookie `console_sso`: `HttpOnly; SameSite=Lax; Path=/console/sso/callback; Max-Age=600`,
plus `Secure` in production. Lax, not Strict: the callback is a top-level navigation from
the issuer, another site, and Strict would withhold the cookie from it. Single use: the
callback clears it, and this process refuses a state it already took until it expires (a
copy of the cookie replayed).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from http.cookies import CookieError, SimpleCookie

import msgspec
import nacl.exceptions
import nacl.secret
from starlette.datastructures import Headers
from starlette.types import Scope

from model_gateway.pipeline.errors import InvalidRequest

COOKIE_NAME = "console_sso"
COOKIE_PATH = "/console/sso/callback"
TTL_S = 600


class PendingSignIn(msgspec.Struct, frozen=True):
    state: str
    nonce: str
    verifier: str  # PKCE code_verifier
    redirect_uri: str
    expires: float  # time.time()

    @property
    def challenge(self) -> str:
        """PKCE S256: base64url(SHA-256(verifier)), unpadded."""
        digest = hashlib.sha256(self.verifier.encode()).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def unknown_sign_in() -> InvalidRequest:
    return InvalidRequest("This sign-in is unknown, used or expired: start again.", param="state")


class PendingSignIns:
    def __init__(self, pepper: bytes, *, secure: bool) -> None:
        key = hmac.new(pepper, b"console single sign-on state", hashlib.sha256).digest()
        self._box = nacl.secret.SecretBox(key)
        self._secure = secure
        self._taken: dict[str, float] = {}  # state -> its expiry

    def begin(self, redirect_uri: str) -> tuple[PendingSignIn, str]:
        """A new sign-in and the Set-Cookie value that carries it."""
        pending = PendingSignIn(
            state=secrets.token_urlsafe(32),
            nonce=secrets.token_urlsafe(32),
            verifier=secrets.token_urlsafe(48),  # 64 characters (RFC 7636: 43 to 128)
            redirect_uri=redirect_uri,
            expires=time.time() + TTL_S,
        )
        sealed = self._box.encrypt(msgspec.json.encode(pending))
        value = base64.urlsafe_b64encode(sealed).rstrip(b"=").decode()
        return pending, self._cookie(value, TTL_S)

    def take(self, scope: Scope, state: str) -> PendingSignIn:
        """The sign-in this callback finishes, once: 400 for a missing, forged, expired or
        used cookie or a `state` other than its own (compared in constant time)."""
        pending = self._opened(scope)
        now = time.time()
        self._taken = {s: expiry for s, expiry in self._taken.items() if expiry > now}
        if (
            pending is None
            or pending.expires <= now
            or not hmac.compare_digest(pending.state.encode(), state.encode())
            or pending.state in self._taken
        ):
            raise unknown_sign_in()
        self._taken[pending.state] = pending.expires
        return pending

    def cleared(self) -> str:
        return self._cookie("", 0)

    def _opened(self, scope: Scope) -> PendingSignIn | None:
        cookie = SimpleCookie()
        try:
            cookie.load(Headers(scope=scope).get("cookie", ""))
            morsel = cookie.get(COOKIE_NAME)
            if morsel is None:
                return None
            sealed = base64.urlsafe_b64decode(morsel.value + "=" * (-len(morsel.value) % 4))
            return msgspec.json.decode(self._box.decrypt(sealed), type=PendingSignIn)
        except (CookieError, ValueError, nacl.exceptions.CryptoError, msgspec.DecodeError):
            return None  # a malformed, forged or foreign cookie: no sign-in in progress

    def _cookie(self, value: str, max_age: int) -> str:
        parts = [f"{COOKIE_NAME}={value}", "HttpOnly", "SameSite=Lax", f"Path={COOKIE_PATH}"]
        if self._secure:
            parts.append("Secure")
        parts.append(f"Max-Age={max_age}")
        return "; ".join(parts)
