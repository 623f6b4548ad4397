"""The limits a sandbox configuration may set (`gateway sandboxes create`), within the node's.

Kept free of imports: the command line reads it, and must start fast.
"""

from typing import NamedTuple


class Limit(NamedTuple):
    low: int
    high: int
    default: int


SANDBOX_LIMITS = {"timeout_s": Limit(1, 300, 10), "memory_mb": Limit(32, 4096, 256)}
