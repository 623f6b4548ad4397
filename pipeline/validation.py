"""Request decoding with msgspec, and msgspec's error paths in the spec's `param` form."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

import msgspec

from model_gateway.pipeline.errors import InvalidRequest
from model_gateway.pipeline.raw_json import (
    not_utf8_error,
    too_deep,
    too_deep_error,
    too_wide_error,
    too_wide_offset,
)

T = TypeVar("T")

_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`")


def param_path(message: str) -> str | None:
    """'... - at `$.messages[0].content`' -> 'messages.0.content'; a missing field is appended."""
    at = _AT.search(message)
    path = at.group("path") if at else ""
    parts = [p for p in re.split(r"[.\[\]]+", path) if p]
    missing = _MISSING.match(message)
    if missing:
        parts.append(missing.group("field"))
    return ".".join(parts) or None


def decoder(request_type: type[T]) -> Callable[[bytes], T]:
    """One msgspec Decoder per request type, built once; its errors become invalid_request,
    and so do bodies nested deeper than 64 levels, not UTF-8 or holding an integer wider
    than 64 bits (`raw_json`), with a path."""
    decode = msgspec.json.Decoder(request_type).decode

    def decode_request(body: bytes) -> T:
        if too_deep(body):
            raise too_deep_error(body)
        try:
            request = decode(body)
        except UnicodeDecodeError:
            raise not_utf8_error(body) from None
        except RecursionError:
            raise too_deep_error(body) from None
        except msgspec.ValidationError as exc:
            text = str(exc)
            raise InvalidRequest(_AT.sub("", text) + ".", param=param_path(text)) from None
        except msgspec.DecodeError:
            raise InvalidRequest("The request body is not valid JSON.") from None
        if (wide := too_wide_offset(body)) is not None:
            raise too_wide_error(body, wide)
        check = getattr(request, "check", None)
        if check is not None:
            check()
        return request

    return decode_request
