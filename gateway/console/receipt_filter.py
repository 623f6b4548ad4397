"""Receipts filtered by model, key, status and dates, for the receipts page, a key's page
and GET .../receipts: query values checked (a bad one is 400 naming it), then the
project's receipts read newest first and kept when they match.

Storage lists a project's receipts by position only, so the filter reads pages of them
and stops at `limit` matches, at the first receipt older than `from` (with a margin:
positions follow issue time to within a group commit), or after SCAN_ROWS receipts read;
`next_cursor` then continues from the last one read, so a long history is walked page
by page rather than in one request. An empty value is no filter: a plain GET form sends
its empty fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

from model_gateway.gateway.console.payload import query_date
from model_gateway.pipeline.errors import InvalidRequest

if TYPE_CHECKING:
    from model_gateway.gateway.console.call import Call
    from model_gateway.storage import Storage
    from model_gateway.storage.base import ReceiptRecord

STATUSES = ("succeeded", "failed", "cancelled")
SCAN_ROWS = 2000  # receipts read at most per request (about 40 ms on SQLite)
_BATCH = 200
_ORDER_MARGIN_US = 60 * 1_000_000  # issue times may be out of position order by this much
_MAX_MODEL = 200


@dataclass(frozen=True, slots=True)
class ReceiptFilter:
    model: str | None = None
    key_prefix: str | None = None
    key_id: str | None = None
    status: str | None = None
    first: date | None = None
    last: date | None = None

    def query(self) -> dict[str, str]:
        """The filter as query values: what a link to the same list carries."""
        values = {
            "model": self.model,
            "key": self.key_prefix,
            "status": self.status,
            "from": None if self.first is None else self.first.isoformat(),
            "to": None if self.last is None else self.last.isoformat(),
        }
        return {name: value for name, value in values.items() if value is not None}

    @property
    def active(self) -> bool:
        return any(
            v is not None for v in (self.model, self.key_id, self.status, self.first, self.last)
        )

    def start_us(self) -> int | None:
        return None if self.first is None else _day_us(self.first)

    def matches(self, receipt: ReceiptRecord) -> bool:
        start = self.start_us()
        return (
            (self.model is None or receipt.model_or_runtime == self.model)
            and (self.key_id is None or receipt.key_id == self.key_id)
            and (self.status is None or receipt.status == self.status)
            and (start is None or receipt.created_at >= start)
            and (self.last is None or receipt.created_at < _day_us(self.last + timedelta(1)))
        )


async def key_prefixes(storage: Storage, project_id: str) -> dict[str | None, str]:
    """The project's key ids to their prefixes: what a receipt's key is shown as."""
    return {listing.key.id: listing.key.prefix for listing in await storage.list_keys(project_id)}


def _day_us(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()) * 1_000_000


def _value(call: Call, name: str) -> str | None:
    value = call.query(name)
    return None if value is None or value == "" else value


async def receipt_filter(storage: Storage, call: Call, project_id: str) -> ReceiptFilter:
    """The filter of the query (400 naming a bad value); `key` is a prefix of one of the
    project's keys."""
    model = _value(call, "model")
    if model is not None and (len(model) > _MAX_MODEL or not model.isprintable()):
        raise InvalidRequest(
            f"'model' must be a model id of at most {_MAX_MODEL} characters.", param="model"
        )
    status = _value(call, "status")
    if status is not None and status not in STATUSES:
        raise InvalidRequest("'status' must be succeeded, failed or cancelled.", param="status")
    prefix, key_id = _value(call, "key"), None
    if prefix is not None:
        key = await storage.get_key(prefix)
        if key is None or key.project_id != project_id:
            raise InvalidRequest(
                "'key' is not the prefix of one of the project's keys.", param="key"
            )
        key_id = key.id
    first_text, last_text = _value(call, "from"), _value(call, "to")
    first = None if first_text is None else query_date(first_text, "from", date.min)
    last = None if last_text is None else query_date(last_text, "to", date.min)
    if first is not None and last is not None and last < first:
        raise InvalidRequest("'to' is before 'from'.", param="to")
    return ReceiptFilter(model, prefix, key_id, status, first, last)


async def filtered_receipts(
    storage: Storage, project_id: str, wanted: ReceiptFilter, limit: int, cursor: int | None
) -> tuple[list[ReceiptRecord], int | None]:
    """Up to `limit` matching receipts newest first from before `cursor`, and the cursor of
    what follows them (None: nothing older matches)."""
    found: list[tuple[int, ReceiptRecord]] = []
    start = wanted.start_us()
    size = _BATCH if wanted.active else limit + 1  # unfiltered: one read, as before
    read = 0
    while read < SCAN_ROWS:
        batch = await storage.list_receipts(project_id, size, cursor)
        for position, receipt in batch:
            if start is not None and receipt.created_at < start - _ORDER_MARGIN_US:
                return [r for _, r in found], None  # older than `from`, as all after it
            read += 1
            cursor = position
            if wanted.matches(receipt):
                found.append((position, receipt))
                if len(found) > limit:  # one more than shown: there is an older page
                    return [r for _, r in found[:limit]], found[limit - 1][0]
            if read == SCAN_ROWS:
                break
        if len(batch) < size:
            return [r for _, r in found], None
    return [r for _, r in found], cursor
