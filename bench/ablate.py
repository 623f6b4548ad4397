r"""What one part of the gateway costs: `bench/paired.py` with B the same gateway with that
part taken out (bench/ablation/sitecustomize.py says what each ablation removes), so the
difference is the part's cost in the same run. docs/speed.md cites them.

    python bench/ablate.py no-settle-sql --connections 1 --bare
    python bench/ablate.py no-log --connections 1
    python bench/ablate.py inline-write --connections 1 --rounds 6
    python bench/ablate.py memory-meter --bare --name-a "metering off" \
        --extra-a "$(printf '[metering]\nenabled = false')"

Any argument after the ablation's name goes to paired.py (`--gateway` sets A's and B's
`gateway`). An ablated gateway does not keep the books: measure with it, never serve.
"""

from __future__ import annotations

import importlib.util
import shlex
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from load import BENCH_DIR

SITE = BENCH_DIR / "ablation"


def ablations() -> list[str]:
    """The names sitecustomize.py knows (loaded under another name: it applies none here)."""
    spec = importlib.util.spec_from_file_location("ablations", SITE / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.ABLATIONS)


def ablated_gateway(gateway: Path, name: str, folder: Path) -> Path:
    """A `gateway` command in `folder` that runs `gateway` with the ablation `name`."""
    ablated = folder / f"gateway-{name}"
    site, target = shlex.quote(str(SITE)), shlex.quote(str(gateway))
    ablated.write_text(
        "#!/bin/sh\n"
        f"PYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}} GATEWAY_ABLATION={name}"
        f' exec {target} "$@"\n'
    )
    ablated.chmod(ablated.stat().st_mode | stat.S_IXUSR)
    return ablated


def main() -> None:
    names = ablations()
    if len(sys.argv) < 2 or sys.argv[1] not in names:
        sys.exit(f"usage: ablate.py {{{','.join(names)}}} [paired.py's arguments]")
    name, rest = sys.argv[1], sys.argv[2:]
    gateway = Path(sys.executable).with_name("gateway")
    if "--gateway" in rest:
        gateway = Path(rest[rest.index("--gateway") + 1])
    with tempfile.TemporaryDirectory() as tmp:
        ablated = ablated_gateway(gateway, name, Path(tmp))
        paired = [sys.executable, str(BENCH_DIR / "paired.py"), "--name-b", name]
        done = subprocess.run([*paired, "--gateway-b", str(ablated), *rest])
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
