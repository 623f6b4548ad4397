"""A fake OpenID Connect identity provider: a real HTTP server (aiohttp, in its own thread)
with discovery, a JWKS, an /authorize that consents at once for the person the test
chose, and a /token that checks the client's credentials (basic or post, as discovery
says) and the PKCE verifier before it answers an ID token signed with a test key.

Knobs, set by the test before the sign-in: `email`, `email_verified`, `tamper` (one of
TAMPERINGS: what is wrong with the next ID tokens), `deny` (the person declines),
`consent_page` (/authorize answers a page whose link goes back, as a real provider's
sign-in does: the way back is then a navigation the provider's site starts, not a
redirect of the navigation the gateway's page started) and `rotate()` (a new signing
key, which the JWKS then serves instead).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlencode

import jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.support.threaded_site import ThreadedSite

TAMPERINGS = (
    "bad-signature",  # signed by a key the JWKS does not hold, under the served key's id
    "wrong-aud",
    "wrong-iss",
    "expired",
    "future-iat",  # issued an hour from now
    "wrong-nonce",
    "no-nonce",
    "unknown-kid",  # a key id the JWKS never serves, even refetched
    "alg-none",  # unsigned
    "hs256",  # HMAC keyed with the public key's PEM: the algorithm-confusion attack
)


@dataclass
class Grant:
    client_id: str
    redirect_uri: str
    challenge: str
    nonce: str
    email: str
    email_verified: bool


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class FakeIdentityProvider:
    host: str = "127.0.0.1"  # the issuer's host name; "localhost" is another site
    client_id: str = "console-test"
    client_secret: str = "idp-client-secret-for-tests"
    auth_method: str = "client_secret_basic"  # or client_secret_post
    algorithm: str = "RS256"  # or ES256
    email: str = "alice@example.com"
    email_verified: bool = True
    tamper: str | None = None
    deny: bool = False
    consent_page: bool = False
    authorize_requests: list[dict[str, str]] = field(default_factory=list)
    token_requests: list[dict[str, str]] = field(default_factory=list)
    issued: list[str] = field(default_factory=list)  # codes and tokens, never to be logged
    jwks_fetches: int = 0
    _grants: dict[str, Grant] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rotate()

    # -- the keys ---------------------------------------------------------------------

    def _new_key(self) -> Any:
        if self.algorithm == "ES256":
            return ec.generate_private_key(ec.SECP256R1())
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def rotate(self) -> None:
        """A new signing key under a new key id; the JWKS serves only it from now on."""
        self.key = self._new_key()
        self.kid = secrets.token_hex(8)

    def _jwk(self) -> dict[str, Any]:
        algorithm = jwt.algorithms.get_default_algorithms()[self.algorithm]
        jwk = json.loads(algorithm.to_jwk(self.key.public_key()))
        return {**jwk, "kid": self.kid, "use": "sig", "alg": self.algorithm}

    # -- the server -------------------------------------------------------------------

    def start(self) -> FakeIdentityProvider:
        app = web.Application()
        app.add_routes(
            [
                web.get("/.well-known/openid-configuration", self._discovery),
                web.get("/jwks", self._jwks),
                web.get("/authorize", self._authorize),
                web.post("/token", self._token),
            ]
        )
        self._site = ThreadedSite(app, "fake identity provider")
        self.port = self._site.start()
        self.url = f"http://{self.host}:{self.port}"
        return self

    def stop(self) -> None:
        self._site.stop()

    def __enter__(self) -> FakeIdentityProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def config(self, *, domains: list[str] | None = None, role: str = "member") -> str:
        """The gateway's [console.oidc] block for this provider (secret in $SSO_SECRET)."""
        return f"""
[console.oidc]
issuer = "{self.url}"
client_id = "{self.client_id}"
client_secret_env = "SSO_SECRET"
allowed_email_domains = {json.dumps(domains if domains is not None else ["example.com"])}
default_role = "{role}"
"""

    # -- the endpoints ----------------------------------------------------------------

    async def _discovery(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "issuer": self.url,
                "authorization_endpoint": self.url + "/authorize",
                "token_endpoint": self.url + "/token",
                "jwks_uri": self.url + "/jwks",
                "response_types_supported": ["code"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": [self.algorithm],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": [self.auth_method],
            }
        )

    async def _jwks(self, request: web.Request) -> web.Response:
        self.jwks_fetches += 1
        return web.json_response({"keys": [self._jwk()]})

    async def _authorize(self, request: web.Request) -> web.Response:
        query = dict(request.query)
        self.authorize_requests.append(query)
        redirect_uri = query.get("redirect_uri", "")
        if (
            query.get("response_type") != "code"
            or query.get("client_id") != self.client_id
            or "openid" not in query.get("scope", "").split()
            or query.get("code_challenge_method") != "S256"
            or not query.get("code_challenge")
            or not redirect_uri
        ):
            return web.json_response({"error": "invalid_request"}, status=400)
        answer = {"state": query.get("state", "")}
        if self.deny:
            answer["error"] = "access_denied"
        else:
            code = secrets.token_urlsafe(24)
            self.issued.append(code)
            self._grants[code] = Grant(
                self.client_id,
                redirect_uri,
                query["code_challenge"],
                query.get("nonce", ""),
                self.email,
                self.email_verified,
            )
            answer["code"] = code
        back = redirect_uri + "?" + urlencode(answer)
        if self.consent_page:
            page = (
                '<!doctype html><html><head><link rel="icon" href="data:,">'
                "<title>Fake identity provider</title></head><body>"
                f'<a href="{html.escape(back)}">Continue as {html.escape(self.email)}</a>'
                "</body></html>"
            )
            return web.Response(text=page, content_type="text/html")
        raise web.HTTPFound(back)

    async def _token(self, request: web.Request) -> web.Response:
        form = dict(await request.post())
        self.token_requests.append({k: str(v) for k, v in form.items()})
        if not self._client_authenticated(request, form):
            return web.json_response({"error": "invalid_client"}, status=401)
        grant = self._grants.pop(str(form.get("code", "")), None)  # single use
        verifier = str(form.get("code_verifier", ""))
        challenge = _b64url(hashlib.sha256(verifier.encode()).digest())
        if (
            form.get("grant_type") != "authorization_code"
            or grant is None
            or grant.redirect_uri != form.get("redirect_uri")
            or not hmac.compare_digest(challenge, grant.challenge)
        ):
            return web.json_response({"error": "invalid_grant"}, status=400)
        id_token = self._id_token(grant)
        access_token = secrets.token_urlsafe(24)
        self.issued += [id_token, access_token]
        return web.json_response(
            {
                "access_token": access_token,
                "token_type": "Bearer",
                "expires_in": 300,
                "id_token": id_token,
            }
        )

    def _client_authenticated(self, request: web.Request, form: dict[str, Any]) -> bool:
        if self.auth_method == "client_secret_post":
            client_id, secret = form.get("client_id"), form.get("client_secret")
        else:
            scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "basic":
                return False
            pair = base64.b64decode(encoded).decode()
            client_id, _, secret = (unquote(part) for part in pair.partition(":"))
        return client_id == self.client_id and secret == self.client_secret

    def _id_token(self, grant: Grant) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.url,
            "sub": "sub-" + hashlib.sha256(grant.email.encode()).hexdigest()[:16],
            "aud": grant.client_id,
            "exp": now + 300,
            "iat": now,
            "nonce": grant.nonce,
            "email": grant.email,
            "email_verified": grant.email_verified,
            "name": grant.email.split("@")[0].title(),
        }
        key, headers = self.key, {"kid": self.kid}
        match self.tamper:
            case "wrong-aud":
                claims["aud"] = "another-client"
            case "wrong-iss":
                claims["iss"] = "https://issuer.example.net"
            case "expired":
                claims["iat"], claims["exp"] = now - 7200, now - 3600
            case "future-iat":
                claims["iat"] = now + 3600
            case "wrong-nonce":
                claims["nonce"] = "not-the-nonce-we-were-sent"
            case "no-nonce":
                del claims["nonce"]
            case "bad-signature":
                key = self._new_key()
            case "unknown-kid":
                key, headers = self._new_key(), {"kid": "never-served"}
            case "alg-none":
                return jwt.encode(claims, None, algorithm="none", headers=headers)
            case "hs256":
                return _hs256_with_public_key(claims, headers, self.key)
        return jwt.encode(claims, key, algorithm=self.algorithm, headers=headers)


def _hs256_with_public_key(claims: dict[str, Any], headers: dict[str, str], key: Any) -> str:
    """HS256 keyed with the public key's PEM, built by hand (PyJWT refuses to)."""
    pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    head = _b64url(json.dumps({"alg": "HS256", "typ": "JWT", **headers}).encode())
    body = _b64url(json.dumps(claims).encode())
    signature = hmac.new(pem, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64url(signature)}"
