"""What the command line writes cannot steer the operator's terminal.

Names, emails, references and model names come from the console, from API clients and
from proof documents fetched over the network: one holding ESC (or C1's CSI, 0x9b) could
recolour the screen, move the cursor over earlier lines, retitle the window or write to
the clipboard. Every control character (C0, DEL, C1) leaves as a visible `\\u001b`-style
escape. That form is also JSON's own, so a `--json` line passes through unchanged in
meaning (JSON already escapes C0; DEL and C1 become escapes that decode to themselves).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")
_CONTROLS_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def escape(text: str) -> str:
    """One field on one line: newlines too are escaped, so that a value cannot start a
    line of its own (a name `x\\nbalance: 1000` would pass for the record's own field)."""
    return _CONTROLS.sub(_escaped, text)


class SafeStream:
    """A text stream that escapes every control character but the newline that ends
    lines, for everything written through it (records, errors, logs, tracebacks)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(_CONTROLS_BUT_NEWLINE.sub(_escaped, text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)  # flush, fileno, isatty, encoding, buffer...


@contextmanager
def safe_output() -> Iterator[None]:
    """sys.stdout and sys.stderr escape control characters while the block runs: the one
    boundary every command's output crosses, whatever prints it."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(sys.stdout), SafeStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
