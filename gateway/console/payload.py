"""Reading console request bodies and query strings: every bad field is a 400 naming it."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Literal, overload

from model_gateway.gateway.access import keys
from model_gateway.gateway.metering.money import parse_amount
from model_gateway.pipeline.errors import InvalidRequest
from model_gateway.storage.base import now_s

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject

_MISSING = object()
_MAX_INT = 2**63 - 1  # storage's integers


class Fields:
    """The fields of one JSON object, checked one at a time; `unknown()` refuses the rest."""

    def __init__(self, body: JSONObject) -> None:
        self.body = body
        self.read: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.body

    def _get(self, name: str, required: bool) -> object:
        """The field's value, or _MISSING (400 if required)."""
        self.read.add(name)
        value = self.body.get(name, _MISSING)
        if value is _MISSING and required:
            raise InvalidRequest(f"The field '{name}' is required.", param=name)
        return value

    @overload
    def string(
        self, name: str, *, required: Literal[True], max_length: int = 200, strip: bool = True
    ) -> str: ...
    @overload
    def string(
        self, name: str, *, required: bool = False, max_length: int = 200, strip: bool = True
    ) -> str | None: ...
    def string(
        self, name: str, *, required: bool = False, max_length: int = 200, strip: bool = True
    ) -> str | None:
        value = self._get(name, required)
        if value is _MISSING or (value is None and not required):
            return None
        if not isinstance(value, str) or not value.strip() or len(value) > max_length:
            raise InvalidRequest(
                f"'{name}' must be a non-empty string of at most {max_length} characters.",
                param=name,
            )
        return value.strip() if strip else value

    @overload
    def amount(self, name: str, *, required: Literal[True], positive: bool = False) -> int: ...
    @overload
    def amount(
        self, name: str, *, required: bool = False, positive: bool = False
    ) -> int | None: ...
    def amount(self, name: str, *, required: bool = False, positive: bool = False) -> int | None:
        value = self._get(name, required)
        if value is _MISSING or (value is None and not required):
            return None
        message = f"'{name}' must be a decimal amount."
        if not isinstance(value, str | int | float):  # null, a list, an object: none parses
            raise InvalidRequest(message, param=name)
        try:
            micros = parse_amount(value)
        except (ValueError, TypeError):
            raise InvalidRequest(message, param=name) from None
        if positive and micros <= 0:
            raise InvalidRequest(f"'{name}' must be more than zero.", param=name)
        return micros

    def positive_int(self, name: str) -> int | None:
        value = self._get(name, False)
        if value is _MISSING or value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= _MAX_INT:
            raise InvalidRequest(f"'{name}' must be a positive integer.", param=name)
        return value

    def string_list(self, name: str) -> list[str] | None:
        value = self._get(name, False)
        if value is _MISSING or value is None:
            return None
        if not isinstance(value, list) or not all(
            isinstance(item, str) and item.strip() for item in value
        ):
            raise InvalidRequest(f"'{name}' must be a list of strings.", param=name)
        return [item.strip() for item in value]

    def scopes(self, name: str = "scopes") -> frozenset[str]:
        value = self._get(name, True)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)
        if not isinstance(value, str):
            raise InvalidRequest(f"'{name}' must be a list of scopes.", param=name)
        try:
            return keys.parse_scopes(value)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param=name) from None

    def time(self, name: str, *, future: bool = False) -> int | None:
        value = self._get(name, False)
        if value is _MISSING or value is None:
            return None
        try:
            moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            seconds = int(moment.timestamp())
            datetime.fromtimestamp(seconds, UTC)  # shown in UTC: 9999-12-31 at -14:00 is not
        except (ValueError, OverflowError):
            raise InvalidRequest(f"'{name}' must be an RFC 3339 time.", param=name) from None
        if future and seconds <= now_s():
            raise InvalidRequest(f"'{name}' must be in the future.", param=name)
        return seconds

    def unknown(self) -> None:
        extra = sorted(set(self.body) - self.read)
        if extra:
            raise InvalidRequest(f"Unknown field '{extra[0]}'.", param=extra[0])


# Query values and headers are ASCII digits only: "²".isdigit() is true, yet int("²") fails,
# and a number beyond storage's 64 bits fails there. Either was a 500; a bad value is a 400.
_WHOLE_NUMBER = re.compile(r"[0-9]{1,19}")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def whole_number(text: str, name: str, message: str) -> int:
    """A non-negative integer storage can hold, else 400 `message` naming `name`."""
    if _WHOLE_NUMBER.fullmatch(text) is None or int(text) > _MAX_INT:
        raise InvalidRequest(message, param=name)
    return int(text)


def query_date(text: str | None, name: str, default: date) -> date:
    """An inclusive UTC day: one whose end (the next day's start) is a date too."""
    if text is None:
        return default
    message = f"'{name}' must be a date YYYY-MM-DD before 9999-12-31."
    try:
        day = date.fromisoformat(text) if _DATE.fullmatch(text) else None
    except ValueError:
        day = None
    if day is None or day == date.max:
        raise InvalidRequest(message, param=name)
    return day


def query_limit(text: str | None, default: int = 50, high: int = 200) -> int:
    if text is None:
        return default
    message = f"'limit' must be between 1 and {high}."
    limit = whole_number(text, "limit", message)
    if not 1 <= limit <= high:
        raise InvalidRequest(message, param="limit")
    return limit


def query_cursor(text: str | None) -> int | None:
    if text is None:
        return None
    return whole_number(text, "cursor", "'cursor' is not a cursor this endpoint gave.")
