"""JSON responses in the one content type the spec names."""

from __future__ import annotations

import orjson
from starlette.responses import Response

from model_gateway.pipeline.errors import JSON_CONTENT_TYPE

_MEDIA_TYPE = JSON_CONTENT_TYPE.decode()


def json_response(
    data: object, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(orjson.dumps(data), status_code=status, headers=headers, media_type=_MEDIA_TYPE)
