"""`gateway doctor`: checks a deployment without changing it, and says what is wrong in
plain words: the config, the storage, the secrets' modes, provider credentials, the
sandbox nodes (reachable, isolated).

Exit 1 only for a problem, what stops the deployment from serving: a broken config,
storage that does not answer, a secret others can read, an available model whose own
provider is unusable, a sandbox node that cannot run code. What `gateway serve` creates
itself (a fresh install's database and secrets), a provider no available model needs and
a spawned node not running yet are warnings: exit 0 (decisions.md, "Hardening III").
"""

from __future__ import annotations

import argparse
import asyncio
import stat
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import orjson

from model_gateway.gateway.config import (
    Config,
    ConfigError,
    SandboxNodeConfig,
    SandboxNodeEntry,
    load_config,
)
from model_gateway.storage import StorageError, open_storage

NODE_TIMEOUT_S = 3

# The CLI's parser class: its subparsers and their parents are of that class.
_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    level: Literal["ok", "warning", "problem"]
    detail: str

    def view(self) -> dict[str, object]:
        return {
            "name": self.name,
            "ok": self.level == "ok",
            "level": self.level,
            "detail": self.detail,
        }


_SHOWN = {"ok": "ok     ", "warning": "WARNING", "problem": "PROBLEM"}


def add_parser(commands: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    p = commands.add_parser("doctor", parents=[common], help="check this deployment")
    p.set_defaults(standalone=run)


def run(args: argparse.Namespace) -> int:
    checks = list(diagnose(args.config))
    serves = all(check.level != "problem" for check in checks)
    if args.json:
        warnings = sum(check.level == "warning" for check in checks)
        record = {"ok": serves, "warnings": warnings, "checks": [c.view() for c in checks]}
        sys.stdout.write(orjson.dumps(record).decode() + "\n")
    else:
        for check in checks:
            print(f"{_SHOWN[check.level]}  {check.name}: {check.detail}")
    return 0 if serves else 1


def diagnose(config_path: str | None) -> Iterator[Check]:
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        yield Check("config", "problem", str(exc))
        return
    yield Check("config", "ok", f"{config.source} is valid")
    yield _storage(config)
    yield from _secrets(config)
    yield from _providers(config)
    nodes = config.sandbox_node_entries()
    if not nodes:
        yield Check("sandbox node", "ok", "not configured: sandbox executions answer 502")
    for name, node in nodes:
        yield _sandbox_node(name, node)


def _storage(config: Config) -> Check:
    url = config.storage_url
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        return Check(
            "storage", "warning", "the database does not exist yet: `gateway serve` creates it"
        )
    try:
        asyncio.run(_answers(url))
    except StorageError as exc:
        return Check("storage", "problem", f"cannot use the storage: {exc}")
    return Check("storage", "ok", "answers")


async def _answers(url: str) -> None:
    storage = await open_storage(url)
    try:
        await storage.health()
    finally:
        await storage.close()


def _private(path: Path, what: str, mode: int) -> Check:
    if not path.exists():
        return Check(what, "warning", f"{path} is missing (`gateway serve` creates it)")
    actual = stat.S_IMODE(path.stat().st_mode)
    if actual & 0o077:
        return Check(
            what, "problem", f"{path} is mode {actual:04o}: others can read it; chmod {mode:04o}"
        )
    return Check(what, "ok", f"{path} is mode {actual:04o}")


def _secrets(config: Config) -> Iterator[Check]:
    pepper = config.path(config.secrets.key_pepper_file)
    yield _private(pepper.parent, "data folder", 0o700)
    yield _private(pepper, "key pepper", 0o600)
    yield _private(config.path(config.secrets.signing_key_file), "signing key", 0o600)
    for secret_file in dict.fromkeys(n.secret_file for _, n in config.sandbox_node_entries()):
        yield _private(config.path(secret_file), "sandbox secret", 0o600)


def _providers(config: Config) -> Iterator[Check]:
    # Here, not at the top: the providers bring aiohttp, 0.18 s of every CLI command's start.
    from model_gateway.gateway.providers import build_provider

    for name, provider in config.providers.items():
        why = provider.not_ready_because() or build_provider(name, provider).credential_problem()
        served = sorted(m for m, model in config.models.items() if model.provider == name)
        needed = [m for m in served if config.models[m].available]
        if not why:
            yield Check(f"provider {name}", "ok", f"ready for {', '.join(served) or 'no model'}")
        elif needed:
            yield Check(
                f"provider {name}", "problem", f"{why}: requests to {', '.join(needed)} answer 503"
            )
        else:
            # A fresh install's example providers: nothing is lost until a model needs one.
            yield Check(f"provider {name}", "warning", f"{why}: no available model needs it")


def _sandbox_node(name: str, node: SandboxNodeEntry) -> Check:
    # `[sandbox_node]` keeps its check's name; `[[sandbox_nodes]]` entries add theirs.
    label = "sandbox node" if name == "sandbox_node" else f"sandbox node {name}"
    try:
        with urllib.request.urlopen(node.url + "/healthz", timeout=NODE_TIMEOUT_S) as answer:  # noqa: S310 (the operator's own URL)
            health = orjson.loads(answer.read())
    except (urllib.error.URLError, OSError, orjson.JSONDecodeError) as exc:
        if isinstance(node, SandboxNodeConfig) and node.spawn:
            hint = " (it starts with `gateway serve`: spawn = true)"
            return Check(label, "warning", f"{node.url} is not reachable: {exc}{hint}")
        return Check(label, "problem", f"{node.url} is not reachable: {exc}")
    isolation = health.get("isolation", {})
    if not isolation.get("will_execute"):
        refusal = isolation.get("refusal")
        return Check(label, "problem", f"reachable but refuses to run code: {refusal}")
    if isolation.get("degraded"):
        notes = "; ".join(isolation.get("notes", []))
        return Check(label, "problem", f"reachable but DEGRADED: {notes}")
    runtimes = ", ".join(isolation.get("runtimes", []))
    return Check(label, "ok", f"reachable and isolated; runtimes {runtimes}")
