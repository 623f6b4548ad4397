"""`gateway doctor`: checks a deployment without changing it, and says what is wrong in
plain words: the config, the storage, the secrets' modes, provider credentials, the
sandbox nodes (reachable, isolated). Exit 0 when every check passes, 1 otherwise."""

from __future__ import annotations

import argparse
import asyncio
import stat
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

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


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


def add_parser(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = commands.add_parser("doctor", parents=[common], help="check this deployment")
    p.set_defaults(standalone=run)


def run(args: argparse.Namespace) -> int:
    checks = list(diagnose(args.config))
    healthy = all(check.ok for check in checks)
    if args.json:
        record = {"ok": healthy, "checks": [asdict(check) for check in checks]}
        sys.stdout.write(orjson.dumps(record).decode() + "\n")
    else:
        for check in checks:
            print(f"{'ok     ' if check.ok else 'PROBLEM'}  {check.name}: {check.detail}")
    return 0 if healthy else 1


def diagnose(config_path: str | None) -> Iterator[Check]:
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        yield Check("config", False, str(exc))
        return
    yield Check("config", True, f"{config.source} is valid")
    yield _storage(config)
    yield from _secrets(config)
    yield from _providers(config)
    nodes = config.sandbox_node_entries()
    if not nodes:
        yield Check("sandbox node", True, "not configured: sandbox executions answer 502")
    for name, node in nodes:
        yield _sandbox_node(name, node)


def _storage(config: Config) -> Check:
    url = config.storage_url
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        return Check(
            "storage", False, "the database does not exist yet: `gateway serve` creates it"
        )
    try:
        asyncio.run(_answers(url))
    except StorageError as exc:
        return Check("storage", False, f"cannot use the storage: {exc}")
    return Check("storage", True, "answers")


async def _answers(url: str) -> None:
    storage = await open_storage(url)
    try:
        await storage.health()
    finally:
        await storage.close()


def _private(path: Path, what: str, mode: int) -> Check:
    if not path.exists():
        return Check(what, False, f"{path} is missing (`gateway serve` creates it)")
    actual = stat.S_IMODE(path.stat().st_mode)
    if actual & 0o077:
        return Check(
            what, False, f"{path} is mode {actual:04o}: others can read it; chmod {mode:04o}"
        )
    return Check(what, True, f"{path} is mode {actual:04o}")


def _secrets(config: Config) -> Iterator[Check]:
    pepper = config.path(config.secrets.key_pepper_file)
    yield _private(pepper.parent, "data folder", 0o700)
    yield _private(pepper, "key pepper", 0o600)
    yield _private(config.path(config.secrets.signing_key_file), "signing key", 0o600)
    for secret_file in dict.fromkeys(n.secret_file for _, n in config.sandbox_node_entries()):
        yield _private(config.path(secret_file), "sandbox secret", 0o600)


def _providers(config: Config) -> Iterator[Check]:
    for name, provider in config.providers.items():
        why = provider.not_ready_because()
        served = sorted(m for m, model in config.models.items() if model.provider == name)
        models = ", ".join(served) or "no model"
        if why:
            yield Check(f"provider {name}", False, f"{why}: requests to {models} answer 503")
        else:
            yield Check(f"provider {name}", True, f"ready for {models}")


def _sandbox_node(name: str, node: SandboxNodeEntry) -> Check:
    # `[sandbox_node]` keeps its check's name; `[[sandbox_nodes]]` entries add theirs.
    label = "sandbox node" if name == "sandbox_node" else f"sandbox node {name}"
    try:
        with urllib.request.urlopen(node.url + "/healthz", timeout=NODE_TIMEOUT_S) as answer:  # noqa: S310 (the operator's own URL)
            health = orjson.loads(answer.read())
    except (urllib.error.URLError, OSError, orjson.JSONDecodeError) as exc:
        spawned = isinstance(node, SandboxNodeConfig) and node.spawn
        hint = " (it starts with `gateway serve` when spawn = true)" if spawned else ""
        return Check(label, False, f"{node.url} is not reachable: {exc}{hint}")
    isolation = health.get("isolation", {})
    if not isolation.get("will_execute"):
        return Check(label, False, f"reachable but refuses to run code: {isolation.get('refusal')}")
    if isolation.get("degraded"):
        return Check(
            label, False, "reachable but DEGRADED: " + "; ".join(isolation.get("notes", []))
        )
    runtimes = ", ".join(isolation.get("runtimes", []))
    return Check(label, True, f"reachable and isolated; runtimes {runtimes}")
