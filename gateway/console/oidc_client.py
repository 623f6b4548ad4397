"""The identity provider's side of single sign-on ([console.oidc]): its discovery document
and signing keys (fetched with aiohttp, cached an hour), the authorization code exchanged
for an ID token, and that token verified with PyJWT, a maintained JOSE library. Imported
only when single sign-on is configured (gateway.console.sso), so PyJWT and cryptography
cost nothing otherwise.

Nothing here is logged, and no error repeats what the issuer sent: codes, tokens and the
client secret go to the issuer and nowhere else.
"""

from __future__ import annotations

import base64
import hmac
import os
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import jwt
import orjson

from model_gateway.gateway.config import OidcConfig
from model_gateway.pipeline.errors import ServiceUnavailable, Unauthenticated

# Asymmetric algorithms only, each taken from the issuer's key, never from the token:
# "none" and HS* (a key anyone holding the public JWKS could use) are never accepted.
ALGORITHMS = frozenset({"RS256", "ES256"})
LEEWAY_S = 60  # clock skew between the issuer and this machine, for exp and iat
CACHE_S = 3600  # discovery and keys; an unknown key id refetches the keys at once
TIMEOUT_S = 10


@dataclass(frozen=True, slots=True)
class Metadata:
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    basic_auth: bool  # client_secret_basic, the default, rather than client_secret_post


def unverified() -> Unauthenticated:
    return Unauthenticated("The identity provider's answer could not be verified.")


def unreachable() -> ServiceUnavailable:
    return ServiceUnavailable("The identity provider cannot be reached; try again later.")


class OidcClient:
    def __init__(self, config: OidcConfig) -> None:
        self.config = config
        self._metadata: tuple[float, Metadata] | None = None
        self._keys: tuple[float, list[jwt.PyJWK]] | None = None

    async def authorization_endpoint(self) -> str:
        return (await self.metadata()).authorization_endpoint

    async def metadata(self) -> Metadata:
        if self._metadata is not None and time.monotonic() - self._metadata[0] < CACHE_S:
            return self._metadata[1]
        issuer = self.config.issuer
        _, document = await _fetch("GET", issuer.rstrip("/") + "/.well-known/openid-configuration")
        # OpenID Connect Discovery 1.0, 4.3: the document names exactly the configured issuer.
        if document is None or document.get("issuer") != issuer:
            raise unreachable()
        scheme = urlsplit(issuer).scheme
        urls: list[str] = []
        for name in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            url = document.get(name)
            if not isinstance(url, str) or urlsplit(url).scheme not in ("https", scheme):
                raise unreachable()
            urls.append(url)
        # client_secret_basic, the default, unless the issuer takes only client_secret_post.
        methods = document.get("token_endpoint_auth_methods_supported")
        post_only = (
            isinstance(methods, list)
            and "client_secret_post" in methods
            and "client_secret_basic" not in methods
        )
        metadata = Metadata(urls[0], urls[1], urls[2], basic_auth=not post_only)
        self._metadata = (time.monotonic(), metadata)
        return metadata

    async def exchange(self, code: str, redirect_uri: str, verifier: str) -> str:
        """The ID token for an authorization code (401 when the issuer refuses it)."""
        metadata = await self.metadata()
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": verifier,
            "client_id": self.config.client_id,
        }
        headers = {"accept": "application/json"}
        secret = self._client_secret()
        if secret is not None and metadata.basic_auth:
            # RFC 6749 2.3.1: each part form-encoded before base64.
            pair = f"{quote(self.config.client_id, safe='')}:{quote(secret, safe='')}"
            headers["authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        elif secret is not None:
            form["client_secret"] = secret
        status, answer = await _fetch("POST", metadata.token_endpoint, data=form, headers=headers)
        id_token = answer.get("id_token") if status == 200 and answer is not None else None
        if not isinstance(id_token, str):
            raise Unauthenticated("The identity provider did not confirm the sign-in.")
        return id_token

    async def verify(self, id_token: str, nonce: str) -> dict[str, Any]:
        """The ID token's claims once its signature (the issuer's key), `iss`, `aud`, `exp`,
        `iat` and `nonce` hold; 401 otherwise."""
        try:
            header = jwt.get_unverified_header(id_token)
        except jwt.PyJWTError:
            raise unverified() from None
        kid = header.get("kid")
        key = _key_for(await self._signing_keys(), kid)
        if key is None:  # the issuer may have rotated its keys since they were fetched
            key = _key_for(await self._signing_keys(refresh=True), kid)
        if key is None or header.get("alg") != key.algorithm_name:
            raise unverified()
        try:
            claims: dict[str, Any] = jwt.decode(
                id_token,
                key.key,
                algorithms=[key.algorithm_name],
                audience=self.config.client_id,
                issuer=self.config.issuer,
                leeway=LEEWAY_S,
                options={"require": ["iss", "aud", "exp", "iat", "sub"]},
            )
        except jwt.PyJWTError:
            raise unverified() from None
        sent = claims.get("nonce")
        if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), nonce.encode()):
            raise unverified()
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if len(audiences) > 1 and claims.get("azp") != self.config.client_id:
            raise unverified()  # Core 1.0, 3.1.3.7: several audiences name us as `azp`
        return claims

    async def _signing_keys(self, *, refresh: bool = False) -> list[jwt.PyJWK]:
        if not refresh and self._keys is not None and time.monotonic() - self._keys[0] < CACHE_S:
            return self._keys[1]
        _, document = await _fetch("GET", (await self.metadata()).jwks_uri)
        found = document.get("keys") if document is not None else None
        if not isinstance(found, list):
            raise unreachable()
        keys = [key for key in map(_usable_key, found) if key is not None]
        self._keys = (time.monotonic(), keys)
        return keys

    def _client_secret(self) -> str | None:
        name = self.config.client_secret_env
        if name is None:
            return None  # a public client: PKCE alone
        secret = os.environ.get(name)
        if not secret:
            raise ServiceUnavailable(f"Single sign-on is not ready: ${name} is not set.")
        return secret


def _usable_key(entry: object) -> jwt.PyJWK | None:
    """A signing key of an accepted algorithm (its `alg`, or the one its type implies)."""
    if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
        return None
    try:
        key = jwt.PyJWK(entry)
    except (jwt.PyJWTError, ValueError, TypeError, KeyError):  # a malformed or unknown key
        return None
    return key if key.algorithm_name in ALGORITHMS else None


def _key_for(keys: list[jwt.PyJWK], kid: object) -> jwt.PyJWK | None:
    if kid is None:
        return keys[0] if len(keys) == 1 else None  # no key id: only a lone key is sure
    return next((key for key in keys if key.key_id == kid), None)


async def _fetch(method: str, url: str, **options: Any) -> tuple[int, dict[str, Any] | None]:
    """The status and JSON object of the issuer's answer (None when it is not one)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session,
            session.request(method, url, allow_redirects=False, **options) as response,
        ):
            status, body = response.status, await response.read()
    except (aiohttp.ClientError, TimeoutError):
        raise unreachable() from None
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return status, None
    return status, value if isinstance(value, dict) else None
