"""The public proof endpoints. None needs a key and none is listed by GET /v1.

- GET /api/proofs/keys: the deployment's public signing keys.
- GET /api/proofs/consistency?first=N[&second=M]: two signed tree heads and the RFC 9162
  consistency proof between them (400 invalid_request, with `param`, for a bad size).
- GET /api/proofs/{receipt_id}: the proof document; 202 {"status": "pending"} with
  `retry-after: 1` while the receipt waits for the log; 404 not_found for no receipt.
- GET /proofs/{receipt_id}: the same as an HTML page (JSON when the client asks only
  for JSON, as `gateway verify` does).
- GET /api/proofs/log/checkpoint: the latest signed tree head as a C2SP checkpoint.
- GET /api/proofs/log/tile/<L>/<N>[.p/<W>] and /api/proofs/log/tile/entries/<N>[.p/<W>]:
  C2SP tlog-tiles, read-only, so that existing monitors and witnesses can mirror the log.

Handlers need the query string and headers, which the request context does not carry, so
they answer with a small ASGI app that reads them from the scope (and renders its own
errors).
"""

from __future__ import annotations

import gzip
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Literal, overload
from urllib.parse import parse_qs

import msgspec
from starlette.responses import HTMLResponse, Response
from starlette.types import Receive, Scope, Send

from model_gateway.gateway.config import Config
from model_gateway.gateway.json_response import json_response
from model_gateway.gateway.proofs.checkpoint import default_origin, verifier_key
from model_gateway.gateway.proofs.links import link_base
from model_gateway.gateway.proofs.log import Pending, TransparencyLog
from model_gateway.gateway.proofs.page import PAGE_HEADERS, not_found_page, pending_page, proof_page
from model_gateway.gateway.proofs.tiles import TILE_WIDTH, parse_tile_path
from model_gateway.gateway.proofs.verify import verify_proof_document
from model_gateway.pipeline.context import RequestContext
from model_gateway.pipeline.endpoint import PUBLIC, Endpoint
from model_gateway.pipeline.errors import GatewayError, InvalidRequest, NotFound, send_error

if TYPE_CHECKING:
    from model_gateway.gateway.proofs.log_key import SigningKey

RETRY_AFTER_S = 1
_OCTETS = "application/octet-stream"
# A full tile never changes. A partial one's URL names its width, so its bytes never
# change either, but the log may drop it once the full tile exists (tlog-tiles): keep it
# briefly. The checkpoint moves every batch (250 ms).
_FULL_TILE_CACHE = "public, max-age=31536000, immutable"
_PARTIAL_TILE_CACHE = "public, max-age=60"
_CHECKPOINT_CACHE = "no-cache"
_JSON_MEDIA_TYPE = "application/json; charset=utf-8"
_MAX_SIZE = 2**63 - 1  # storage's integers: a tree is never larger


class _FromScope:
    """An ASGI app that builds its response from the scope; raised GatewayErrors are
    rendered like the dispatch stage renders them."""

    def __init__(self, request_id: str, build: Callable[[Scope], Awaitable[Response]]) -> None:
        self.request_id = request_id
        self.build = build

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            response = await self.build(scope)
        except GatewayError as error:
            await send_error(send, error, self.request_id)
            return
        await response(scope, receive, send)


def _header(scope: Scope, name: bytes) -> str:
    headers: Iterable[tuple[bytes, bytes]] = scope.get("headers", ())
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return ""


def _wants_json(scope: Scope) -> bool:
    accept = _header(scope, b"accept").lower()
    return "application/json" in accept and "text/html" not in accept


@overload
def _size(query: dict[str, list[str]], name: str, *, required: Literal[True]) -> int: ...
@overload
def _size(query: dict[str, list[str]], name: str, *, required: bool) -> int | None: ...
def _size(query: dict[str, list[str]], name: str, *, required: bool) -> int | None:
    values = query.get(name)
    if not values:
        if required:
            raise InvalidRequest(f"`{name}` is required: a tree size.", param=name)
        return None
    text = values[-1]
    if not text.isascii() or not text.isdigit() or len(text) > 19 or int(text) > _MAX_SIZE:
        raise InvalidRequest(f"`{name}` must be a tree size, a whole number.", param=name)
    return int(text)


def log_origin(config: Config) -> str:
    """The checkpoint origin: [proofs] origin, else `<public_url host>/log`."""
    return config.proofs.origin or default_origin(config.server.public_url)


def _entry_bundle(entries: list[bytes]) -> bytes:
    # tlog-tiles: big-endian uint16 length-prefixed entries. A public receipt is a few
    # hundred bytes; one that could not be framed would be a bug, not a request error.
    return b"".join(len(e).to_bytes(2, "big") + e for e in entries)


def _encoded(struct: msgspec.Struct) -> Response:
    return Response(msgspec.json.encode(struct), media_type=_JSON_MEDIA_TYPE)


class ProofHandlers:
    def __init__(
        self, log: TransparencyLog, signing_key: SigningKey, public_url: str | None
    ) -> None:
        self.log = log
        self.signing_key = signing_key
        self.public_url = public_url

    def routes(self) -> list[Endpoint]:
        return [
            # Exact paths are matched before templates: "keys" is never taken for an id.
            Endpoint("GET", "/api/proofs/keys", PUBLIC, self.keys, listed=False),
            Endpoint("GET", "/api/proofs/consistency", PUBLIC, self.consistency, listed=False),
            Endpoint("GET", "/api/proofs/log/checkpoint", PUBLIC, self.checkpoint, listed=False),
            Endpoint("GET", "/api/proofs/log/tile/{tile:path}", PUBLIC, self.tile, listed=False),
            Endpoint("GET", "/api/proofs/{receipt_id}", PUBLIC, self.proof, listed=False),
            Endpoint("GET", "/proofs/{receipt_id}", PUBLIC, self.page, listed=False),
        ]

    async def keys(self, ctx: RequestContext) -> Response:
        key = self.signing_key
        origin = self.log.origin
        # The same key signs checkpoints as a note signer named after the log's origin.
        record = key.public_record() | {
            "checkpoint_origin": origin,
            "vkey": verifier_key(origin, key.public_key),
        }
        return json_response({"object": "list", "data": [record]})

    async def checkpoint(self, ctx: RequestContext) -> Response:
        note = await self.log.checkpoint()
        return Response(
            note.encode(),
            media_type="text/plain; charset=utf-8",
            headers={"cache-control": _CHECKPOINT_CACHE},
        )

    async def tile(self, ctx: RequestContext) -> _FromScope:
        parsed = parse_tile_path(ctx.path_params["tile"])
        if parsed is None:
            raise NotFound("No such tile: paths are tile/<L>/<N>[.p/<W>] (c2sp.org/tlog-tiles).")
        level, index, width = parsed
        if level == "entries":
            entries = await self.log.entries(index, width)
            body = None if entries is None else _entry_bundle(entries)
        else:
            assert isinstance(level, int)
            body = await self.log.tile(level, index, width)
        if body is None:
            raise NotFound("No signed tree head covers this tile yet.")
        cache = _FULL_TILE_CACHE if width == TILE_WIDTH else _PARTIAL_TILE_CACHE
        headers = {"cache-control": cache}
        if level == "entries":
            headers["vary"] = "accept-encoding"

        async def build(scope: Scope) -> Response:
            # Entry bundles are JSON text: gzip makes them 4.4x smaller (tlog-tiles: SHOULD).
            # Level 1: 0.6 ms for a full bundle where level 6 takes 1.3 ms for 8% less.
            if level == "entries" and "gzip" in _header(scope, b"accept-encoding").lower():
                gzipped = gzip.compress(body, compresslevel=1, mtime=0)
                return Response(
                    gzipped, media_type=_OCTETS, headers=headers | {"content-encoding": "gzip"}
                )
            return Response(body, media_type=_OCTETS, headers=headers)

        return _FromScope(ctx.request_id, build)

    async def consistency(self, ctx: RequestContext) -> _FromScope:
        async def build(scope: Scope) -> Response:
            query_string: bytes = scope.get("query_string", b"")
            query = parse_qs(query_string.decode("latin-1"))
            first = _size(query, "first", required=True)
            second = _size(query, "second", required=False)
            if first < 1:
                raise InvalidRequest("`first` must be at least 1.", param="first")
            if second is None:
                second = max(first, self.log.size)  # the latest head
            elif second < first:
                raise InvalidRequest("`second` must be at least `first`.", param="second")
            try:
                first_head, second_head, proof = await self.log.consistency(first, second)
            except KeyError as unknown:
                name = unknown.args[0]
                raise InvalidRequest(
                    f"No signed tree head of size {first if name == 'first' else second} exists.",
                    param=name,
                ) from None
            return json_response(
                {
                    "first": first,
                    "second": second,
                    "first_tree_head": msgspec.to_builtins(first_head),
                    "second_tree_head": msgspec.to_builtins(second_head),
                    "consistency_proof": [h.hex() for h in proof],
                }
            )

        return _FromScope(ctx.request_id, build)

    async def _proof_json(self, receipt_id: str) -> Response:
        try:
            doc = await self.log.proof(receipt_id)
        except Pending:
            return json_response(
                {
                    "status": "pending",
                    "receipt_id": receipt_id,
                    "message": "The receipt is being added to the transparency log.",
                    "retry_after_seconds": RETRY_AFTER_S,
                },
                status=202,
                headers={"retry-after": str(RETRY_AFTER_S), "cache-control": "no-store"},
            )
        if doc is None:
            raise NotFound("No receipt with this ID exists.")
        return _encoded(doc)

    async def proof(self, ctx: RequestContext) -> _FromScope:
        receipt_id = ctx.path_params["receipt_id"]
        return _FromScope(ctx.request_id, lambda scope: self._proof_json(receipt_id))

    async def page(self, ctx: RequestContext) -> _FromScope:
        receipt_id = ctx.path_params["receipt_id"]

        async def build(scope: Scope) -> Response:
            if _wants_json(scope):
                return await self._proof_json(receipt_id)
            headers = dict(PAGE_HEADERS)
            try:
                doc = await self.log.proof(receipt_id)
            except Pending:
                headers["cache-control"] = "no-store"
                return HTMLResponse(pending_page(receipt_id), status_code=202, headers=headers)
            if doc is None:
                return HTMLResponse(not_found_page(receipt_id), status_code=404, headers=headers)
            # Checked as any verifier would: from the encoded document, against our key.
            result = verify_proof_document(msgspec.to_builtins(doc), self.signing_key.public_key)
            # Links from the operator's public_url or the mount, never from Host.
            base = link_base(self.public_url, scope)
            html = proof_page(doc, result, link_base=base)
            return HTMLResponse(html, headers=headers)

        return _FromScope(ctx.request_id, build)
