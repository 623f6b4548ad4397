"""The JSON the gateway carries without a schema of its own: requests as the client sent
them (once validated, gateway.inference.schemas) and answers, chunks and events as an
upstream sent them (checked at the boundary, gateway.providers.shapes)."""

from __future__ import annotations

from typing import Any

# A decoded JSON object: a request, an answer, a chunk, an event's payload. Its values are
# whatever JSON holds, read with `.get` and checked where the gateway relies on them.
JSONObject = dict[str, Any]
