"""A `gateway` command for another revision, without a venv of its own: a detached git
worktree of REV at DEST, and DEST/gateway, which runs this venv's Python with the
worktree's `model_gateway` in front of the editable install (a package in a folder on
PYTHONPATH whose `gateway`, `pipeline` and `storage` are the worktree's). The compiled
storage modules (git ignores them) are copied from this checkout. For paired runs
against an old revision, or against the shared tree's own HEAD while other edits are
half done in it:

    python bench/checkout_gateway.py HEAD~3 /tmp/old
    python bench/realistic.py --gateway-b /tmp/old/gateway --name-b before
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from load import BENCH_DIR

ROOT = BENCH_DIR.parent
PACKAGES = ("gateway", "pipeline", "storage")


def checkout(rev: str, dest: Path) -> Path:
    tree = dest / "tree"
    if tree.exists():
        subprocess.run(["git", "-C", str(tree), "checkout", "-q", "--detach", rev], check=True)
    else:
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), rev],
            check=True,
        )
    for built in (ROOT / "storage").glob("*.so"):
        shutil.copy2(built, tree / "storage" / built.name)
    package = dest / "path" / "model_gateway"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    for name in PACKAGES:
        link = package / name
        if not link.exists():
            link.symlink_to(tree / name)
    command = dest / "gateway"
    command.write_text(
        "#!/bin/sh\n"
        f"PYTHONPATH={dest / 'path'}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} -c "
        '\'import sys; from model_gateway.gateway.cli import main; sys.argv[0] = "gateway"; '
        'sys.exit(main())\' "$@"\n'
    )
    command.chmod(0o755)
    return command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev")
    parser.add_argument("dest", type=Path)
    args = parser.parse_args()
    print(checkout(args.rev, args.dest.resolve()))


if __name__ == "__main__":
    main()
