"""Projects, their keys and their sandbox configurations, as the console's JSON API."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.responses import Response

from model_gateway.gateway.admin import key_admin, project_admin, sandbox_admin
from model_gateway.gateway.admin.admin_context import AdminContext
from model_gateway.gateway.admin.admin_views import (
    KeyView,
    ProjectView,
    iso,
    key_view,
    sandbox_view,
    with_instances,
)
from model_gateway.gateway.admin.admin_views import project_view as admin_project_view
from model_gateway.gateway.admin.key_admin import KeyChanges
from model_gateway.gateway.admin.project_admin import ProjectChanges, ProjectLimits
from model_gateway.gateway.console.call import SESSION, Call, route
from model_gateway.gateway.console.guard import (
    project_of,
    require_active,
    require_owner,
    visible_project,
)
from model_gateway.gateway.console.onchain import address_of
from model_gateway.gateway.console.payload import Fields
from model_gateway.gateway.console.views import page
from model_gateway.gateway.json_response import json_response
from model_gateway.gateway.sandbox.limits import SANDBOX_LIMITS
from model_gateway.pipeline.endpoint import Endpoint
from model_gateway.pipeline.errors import Conflict, Forbidden, InvalidRequest, NotFound
from model_gateway.storage import PayerAddressTaken, StateConflict, Storage
from model_gateway.storage.base import KeyListing, ProjectRecord, UserRecord

if TYPE_CHECKING:
    from model_gateway.gateway.console.mount import Console

_PROJECT = "/console/api/projects/{project_id}"
MEMBER_PATCH_FIELDS = frozenset({"name"})  # what a member may PATCH (decisions, Hardening III)


class ConsoleProjectView(ProjectView):
    payer_addresses: list[str]


class KeyListingView(KeyView):
    name: str | None
    last_used_at: str | None


async def project_view(admin: AdminContext, project: ProjectRecord) -> ConsoleProjectView:
    """The CLI's view of a project, with the addresses it pays from onchain."""
    view = await admin_project_view(admin, project)
    return {**view, "payer_addresses": await admin.storage.payer_addresses(project.id)}


def _payers(fields: Fields) -> list[str] | None:
    """`payer_addresses` when present (null clears them), else None."""
    if not fields.has("payer_addresses"):
        return None
    values = fields.string_list("payer_addresses") or []
    return sorted({address_of(v, f"payer_addresses.{n}") for n, v in enumerate(values)})


async def key_listing_view(admin: AdminContext, listing: KeyListing) -> KeyListingView:
    view = await key_view(admin, listing.key)
    return {**view, "name": listing.name, "last_used_at": iso(listing.last_used_at)}


async def visible_key(admin: AdminContext, user: UserRecord, prefix: str) -> KeyListing:
    """The key with this prefix, with its name and last use, if the user may see its
    project (else 404, as a missing one)."""
    key = await admin.storage.get_key(prefix)
    if key is None:
        raise NotFound("No key with this prefix exists.")
    await visible_project(admin.storage, user, key.project_id)
    for listing in await admin.storage.list_keys(key.project_id):
        if listing.key.id == key.id:
            return listing
    raise NotFound("No key with this prefix exists.")


async def project_of_key(storage: Storage, listing: KeyListing) -> ProjectRecord:
    project = await storage.get_project(listing.key.project_id)
    if project is None:
        raise NotFound("No key with this prefix exists.")
    return project


def _key_changes(fields: Fields) -> KeyChanges:
    """The key's fields present in a PATCH body (null clears an optional one), as the CLI's
    `keys update` changes them."""
    changes: KeyChanges = {}
    if fields.has("name"):
        changes["name"] = fields.string("name")
    if fields.has("models"):
        changes["models"] = fields.string_list("models")
    if fields.has("monthly_limit"):
        changes["monthly_limit"] = fields.amount("monthly_limit")
    if fields.has("expires_at"):
        changes["expires_at"] = fields.time("expires_at", future=True)
    if fields.has("rpm"):
        changes["rpm"] = fields.positive_int("rpm")
    if fields.has("tpm"):
        changes["tpm"] = fields.positive_int("tpm")
    return changes


def _project_options(fields: Fields, options: ProjectLimits) -> None:
    """The limits and model policy present in the body, into `options` (None clears an
    optional limit)."""
    if fields.has("monthly_budget"):
        options["monthly_budget"] = fields.amount("monthly_budget")
    if fields.has("rpm"):
        options["rpm"] = fields.positive_int("rpm")
    if fields.has("tpm"):
        options["tpm"] = fields.positive_int("tpm")
    if fields.has("allow_models"):
        options["allow_models"] = fields.string_list("allow_models")
    if fields.has("exclude_models"):
        options["exclude_models"] = fields.string_list("exclude_models")


def routes(console: Console) -> list[Endpoint]:
    storage, admin = console.storage, console.admin

    async def list_projects(call: Call) -> Response:
        user = call.session_user
        ids = None if user.role == "owner" else await storage.granted_projects(user.id)
        projects = await storage.list_projects(ids)
        return json_response(page([await project_view(admin, p) for p in projects]))

    async def create_project(call: Call) -> Response:
        require_owner(call.session_user)
        fields = Fields(await call.json())
        name = fields.string("name", required=True)
        options: ProjectLimits = {}
        _project_options(fields, options)
        fields.unknown()
        created = await project_admin.create_project(admin, name=name, **options)
        view = await admin_project_view(admin, created)
        return json_response({**view, "payer_addresses": []}, status=201)

    async def show_project(call: Call) -> Response:
        return json_response(await project_view(admin, await project_of(storage, call)))

    async def patch_project(call: Call) -> Response:
        found = await project_of(storage, call)
        body = await call.json()
        if call.session_user.role != "owner" and set(body) - MEMBER_PATCH_FIELDS:
            # Budget, limits, model policy and payer addresses are money: the owner's.
            # Named by what members may change, so that a field added later (tpm) is too.
            raise Forbidden("Only an owner may change a project's limits, models or payers.")
        fields = Fields(body)
        changes: ProjectChanges = {}
        _project_options(fields, changes)
        if fields.has("name"):
            changes["name"] = fields.string("name", required=True)
        payers = _payers(fields)
        fields.unknown()
        require_active(found)
        try:
            # The payers first: one another project holds refuses the whole change.
            updated = await project_admin.update_project(
                admin, found.id, changes, payer_addresses=payers
            )
        except PayerAddressTaken:
            raise Conflict(
                "Another project has registered this payer address: an address pays for one"
                " project only.",
                param="payer_addresses",
            ) from None
        except StateConflict:
            raise Conflict("The project is archived: it is read-only.") from None
        view = await project_view(admin, updated.record)
        return json_response(with_instances(view, updated.confirmation))

    async def archive_project(call: Call) -> Response:
        require_owner(call.session_user)
        found = await project_of(storage, call)
        try:
            archived = await project_admin.archive_project(admin, found.id)
        except StateConflict:
            raise Conflict("The project is already archived.") from None
        view = await project_view(admin, archived.record)
        return json_response(with_instances(view, archived.confirmation))

    async def list_keys(call: Call) -> Response:
        found = await project_of(storage, call)
        listings = await storage.list_keys(found.id)
        return json_response(page([await key_listing_view(admin, x) for x in listings]))

    async def create_key(call: Call) -> Response:
        found = await project_of(storage, call)
        fields = Fields(await call.json())
        scopes = fields.scopes()
        models = fields.string_list("models")
        monthly_limit = fields.amount("monthly_limit")
        expires_at = fields.time("expires_at", future=True)
        rpm = fields.positive_int("rpm")
        tpm = fields.positive_int("tpm")
        name = fields.string("name")
        fields.unknown()
        require_active(found)
        created = await key_admin.create_key(
            admin,
            found.id,
            scopes=scopes,
            name=name,
            models=models,
            monthly_limit=monthly_limit,
            expires_at=expires_at,
            rpm=rpm,
            tpm=tpm,
        )
        view = {"key": created.secret, **await key_view(admin, created.record)}
        return json_response({**view, "name": name, "last_used_at": None}, status=201)

    async def show_key(call: Call) -> Response:
        listing = await visible_key(admin, call.session_user, call.params["prefix"])
        return json_response(await key_listing_view(admin, listing))

    async def patch_key(call: Call) -> Response:
        listing = await visible_key(admin, call.session_user, call.params["prefix"])
        fields = Fields(await call.json())
        changes = _key_changes(fields)
        fields.unknown()
        require_active(await project_of_key(storage, listing))
        try:
            updated = await key_admin.update_key(admin, listing.key.prefix, changes)
        except StateConflict:
            raise Conflict("The key is revoked: it cannot change.") from None
        listing.key = updated.record
        view = await key_listing_view(admin, listing)
        return json_response(with_instances(view, updated.confirmation))

    async def revoke_key(call: Call) -> Response:
        key = await storage.get_key(call.params["prefix"])
        if key is None:
            raise NotFound("No key with this prefix exists.")
        await visible_project(storage, call.session_user, key.project_id)  # else as absent: 404
        try:
            revoked = await key_admin.revoke_key(admin, key.prefix)
        except StateConflict:
            raise Conflict("The key is already revoked.") from None
        view = await key_view(admin, revoked.record)
        return json_response(with_instances(view, revoked.confirmation))

    async def list_sandboxes(call: Call) -> Response:
        found = await project_of(storage, call)
        sandboxes = await storage.list_sandboxes(found.id)
        return json_response(page([sandbox_view(s) for s in sandboxes]))

    async def create_sandbox(call: Call) -> Response:
        found = await project_of(storage, call)
        fields = Fields(await call.json())
        runtime = fields.string("runtime", required=True)
        if runtime not in ("python", "node", "bash"):
            raise InvalidRequest("'runtime' must be python, node or bash.", param="runtime")
        limits: dict[str, int] = {}
        for name in ("timeout_s", "memory_mb"):
            value = fields.positive_int(name)
            limits[name] = SANDBOX_LIMITS[name].default if value is None else value
        fields.unknown()
        require_active(found)
        created = await sandbox_admin.create_sandbox(admin, found.id, runtime=runtime, **limits)
        return json_response({**sandbox_view(created), "payer_addresses": []}, status=201)

    return [
        route("GET", "/console/api/projects", SESSION, list_projects),
        route("POST", "/console/api/projects", SESSION, create_project),
        route("GET", _PROJECT, SESSION, show_project),
        route("PATCH", _PROJECT, SESSION, patch_project),
        route("POST", _PROJECT + "/archive", SESSION, archive_project),
        route("GET", _PROJECT + "/keys", SESSION, list_keys),
        route("POST", _PROJECT + "/keys", SESSION, create_key),
        route("GET", "/console/api/keys/{prefix}", SESSION, show_key),
        route("PATCH", "/console/api/keys/{prefix}", SESSION, patch_key),
        route("POST", "/console/api/keys/{prefix}/revoke", SESSION, revoke_key),
        route("GET", _PROJECT + "/sandboxes", SESSION, list_sandboxes),
        route("POST", _PROJECT + "/sandboxes", SESSION, create_sandbox),
    ]
