from typing import TypeVar

_W = TypeVar("_W")  # a write: (sql, parameter tuple), or (marker, [(sql, [tuples])])

class Writer:
    """A SQLite connection that runs group-committed batches with the GIL released."""

    def __init__(self, path: str, pragmas: tuple[str, ...]) -> None: ...
    def run(self, batch: list[_W]) -> list[object]: ...
    def close(self) -> None: ...

def pack(prefix: str, value: str | None) -> str | bytes | None:
    """The bytes of the lowercase hex after `prefix` in `value`, or `value` as it is."""
