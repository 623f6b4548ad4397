"""`gateway doctor`: checks a deployment without changing it, and says what is wrong in
plain words: the config, the storage, the secrets' modes, provider credentials, the
sandbox node (reachable, isolated). Exit 0 when every check passes, 1 otherwise."""

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

from model_gateway.gateway.config import Config, ConfigError, load_config
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
    yield from _sandbox_node(config)


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
    if config.sandbox_node is not None:
        yield _private(config.path(config.sandbox_node.secret_file), "sandbox secret", 0o600)


def _providers(config: Config) -> Iterator[Check]:
    for name, provider in config.providers.items():
        why = provider.not_ready_because()
        served = sorted(m for m, model in config.models.items() if model.provider == name)
        models = ", ".join(served) or "no model"
        if why:
            yield Check(f"provider {name}", False, f"{why}: requests to {models} answer 503")
        else:
            yield Check(f"provider {name}", True, f"ready for {models}")


def _sandbox_node(config: Config) -> Iterator[Check]:
    node = config.sandbox_node
    if node is None:
        yield Check("sandbox node", True, "not configured: sandbox executions answer 502")
        return
    try:
        with urllib.request.urlopen(node.url + "/healthz", timeout=NODE_TIMEOUT_S) as answer:  # noqa: S310 (the operator's own URL)
            health = orjson.loads(answer.read())
    except (urllib.error.URLError, OSError, orjson.JSONDecodeError) as exc:
        hint = " (it starts with `gateway serve` when spawn = true)" if node.spawn else ""
        yield Check("sandbox node", False, f"{node.url} is not reachable: {exc}{hint}")
        return
    isolation = health.get("isolation", {})
    if not isolation.get("will_execute"):
        yield Check(
            "sandbox node", False, f"reachable but refuses to run code: {isolation.get('refusal')}"
        )
    elif isolation.get("degraded"):
        yield Check(
            "sandbox node",
            False,
            "reachable but DEGRADED: " + "; ".join(isolation.get("notes", [])),
        )
    else:
        runtimes = ", ".join(isolation.get("runtimes", []))
        yield Check("sandbox node", True, f"reachable and isolated; runtimes {runtimes}")
