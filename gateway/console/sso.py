"""Single sign-on to the console with the team's identity provider ([console.oidc];
decisions.md, "Operators (wave 3)"): OpenID Connect's authorization-code flow with PKCE
(S256), `state` and `nonce`.

GET /console/sso/start: 303 to the issuer's authorization endpoint, the sign-in in
progress sealed in a cookie (sso_state). GET /console/sso/callback: that sign-in taken
(its `state`), the code exchanged and the ID token verified (oidc_client), then the user
of its verified email, if its domain is allowed: an existing user as they are (their
role kept, refused when disabled), a new one created with `default_role` and no usable
password. Refused: the sign-in page with the error and its status, no user, no session.
Without [console.oidc] neither path exists (404), and PyJWT is never imported.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from starlette.responses import RedirectResponse, Response

from model_gateway.gateway.admin.admin_context import user_actor
from model_gateway.gateway.admin.audit_trail import acting
from model_gateway.gateway.admin.user_admin import create_user
from model_gateway.gateway.console.api_session import open_session
from model_gateway.gateway.console.call import Call, route
from model_gateway.gateway.console.guard import own_origin
from model_gateway.gateway.console.html import esc, page
from model_gateway.gateway.console.pages import login_page
from model_gateway.gateway.console.sso_state import COOKIE_PATH, PendingSignIns
from model_gateway.pipeline.endpoint import PUBLIC, Endpoint
from model_gateway.pipeline.errors import Forbidden, GatewayError, InvalidRequest
from model_gateway.storage.base import StateConflict, UserRecord

if TYPE_CHECKING:
    from model_gateway.gateway.config import OidcConfig
    from model_gateway.gateway.console.mount import Console


def routes(console: Console) -> list[Endpoint]:
    settings = console.config.console.oidc
    if settings is None:
        return []
    from model_gateway.gateway.console.oidc_client import OidcClient  # PyJWT: only now

    client = OidcClient(settings)
    pending = PendingSignIns(console.admin.pepper(), secure=console.sessions.secure)

    async def start(call: Call) -> Response:
        try:
            endpoint = await client.authorization_endpoint()
        except GatewayError as error:
            return login_page(error=error, sso=True)
        sign_in, cookie = pending.begin(_callback_url(console, call))
        query = urlencode(
            {
                "response_type": "code",
                "client_id": settings.client_id,
                "redirect_uri": sign_in.redirect_uri,
                "scope": "openid email profile",
                "state": sign_in.state,
                "nonce": sign_in.nonce,
                "code_challenge": sign_in.challenge,
                "code_challenge_method": "S256",
            }
        )
        location = endpoint + ("&" if "?" in endpoint else "?") + query
        return RedirectResponse(location, status_code=303, headers={"set-cookie": cookie})

    async def verified_claims(call: Call) -> dict[str, Any]:
        sign_in = pending.take(call.request.scope, call.query("state") or "")
        if call.query("error") is not None:  # the person or the issuer declined
            raise Forbidden("The identity provider did not sign you in.")
        code = call.query("code")
        if not code:
            raise InvalidRequest("The identity provider sent no code.", param="code")
        id_token = await client.exchange(code, sign_in.redirect_uri, sign_in.verifier)
        return await client.verify(id_token, sign_in.nonce)

    async def user_of(call: Call, claims: dict[str, Any]) -> UserRecord:
        try:
            email = _allowed_email(settings, claims)
            # A user made by their own first sign-in is recorded as made by them.
            with acting(user_actor(email), call.request_id):
                return await _user_of(console, settings, email)
        except GatewayError:
            # A verified token refused here is a failed sign-in of its email, audited as
            # the password's are (and counted by the same throttle).
            address = call.request.client.host if call.request.client else "unknown"
            await console.throttle.failed(str(claims.get("email")), address)
            raise

    async def callback(call: Call) -> Response:
        try:
            user = await user_of(call, await verified_claims(call))
        except GatewayError as error:
            refused = login_page(error=error, sso=True)
            refused.headers.append("set-cookie", pending.cleared())
            return refused
        response = _signed_in_page(call.request.scope.get("root_path", ""))
        response.headers.append("set-cookie", await open_session(console, call, user))
        response.headers.append("set-cookie", pending.cleared())
        return response

    return [
        route("GET", "/console/sso/start", PUBLIC, start),
        route("GET", COOKIE_PATH, PUBLIC, callback),
    ]


def _callback_url(console: Console, call: Call) -> str:
    """`<public_url, else the request's own origin and mount prefix>/console/sso/callback`."""
    scope = call.request.scope
    base = console.public_url or own_origin(scope, None) + scope.get("root_path", "")
    return base.rstrip("/") + COOKIE_PATH


def _allowed_email(settings: OidcConfig, claims: dict[str, Any]) -> str:
    """The verified email, if its domain may sign in (403 otherwise)."""
    email = claims.get("email")
    # A boolean in the standard; some issuers send the string.
    if not isinstance(email, str) or claims.get("email_verified") not in (True, "true"):
        raise Forbidden("The identity provider has not verified your email address.")
    allowed = {d.lower().lstrip("@") for d in settings.allowed_email_domains}
    local, at, domain = email.rpartition("@")
    if not local or not at or "@" in local or (allowed and domain.lower() not in allowed):
        raise Forbidden("Your email address's domain may not sign in to this console.")
    return email


async def _user_of(console: Console, settings: OidcConfig, email: str) -> UserRecord:
    user = await console.storage.get_user(email)
    if user is None:
        try:
            # No usable password: a random one nobody is told (SSO users sign in by SSO).
            user = await create_user(
                console.admin, email, secrets.token_urlsafe(32), settings.default_role
            )
        except StateConflict:  # created by a sign-in at the same moment
            user = await console.storage.get_user(email)
    if user is None or user.disabled:
        raise Forbidden("This account is disabled.")
    return user


def _signed_in_page(root: str) -> Response:
    """Signed in, then on to the console through this page, not a redirect: the session
    cookie is SameSite=Strict, and a browser withholds it from every hop of a redirect
    chain that began on the issuer's site. A refresh from our own page is same-site."""
    target = root + "/console/projects"
    body = (
        f'<meta http-equiv="refresh" content="0; url={esc(target)}">'
        '<section class="signin"><h1>Signed in</h1>'
        '<p><a href="/console/projects">Continue to the console</a></p></section>'
    )
    return page("Signed in", body)
