"""The runtimes a sandbox runs: a leaf, so that what names them (the agents' tool, the echo
provider that calls it) does not import the sandbox client."""

from __future__ import annotations

from typing import Literal, get_args

Runtime = Literal["python", "node", "bash"]
RUNTIMES: tuple[str, ...] = get_args(Runtime)
