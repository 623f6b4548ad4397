"""The start-up summary: what this gateway serves, and for each provider and model whether it
is ready or, in plain words, why not."""

from __future__ import annotations

from model_gateway.gateway.config import Config, SandboxNodeConfig


def redacted_storage_url(url: str) -> str:
    """A storage URL without its password (postgresql://user:secret@host/db)."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    return f"{scheme}{sep}{credentials.split(':', 1)[0]}:***@{host}"


# A wildcard listen address, and the loopback address a browser on this host can open.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # noqa: S104 (not bound)


def listen_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def console_url(config: Config, host: str, port: int) -> str:
    """Where the operator opens the console: under `[server] public_url` when set, else
    on the listen address (a wildcard one as loopback, which a browser here can open)."""
    if config.server.public_url:
        return config.server.public_url.rstrip("/") + "/console"
    return listen_url(_WILDCARDS.get(host, host), port) + "/console"


def startup_summary(config: Config) -> list[str]:
    lines = [f"config {config.source}", f"storage {redacted_storage_url(config.storage_url)}"]
    for name, provider in config.providers.items():
        why = provider.not_ready_because()
        lines.append(f"provider {name} ({provider.kind}): {_state(why)}")
    for model_id, model in config.models.items():
        why = config.providers[model.provider].not_ready_because()
        if not model.available:
            why = "marked available = false"
        elif not model.priced:
            why = "no price configured (input_price_per_mtok, output_price_per_mtok)"
        lines.append(f"model {model_id} via {model.provider}: {_state(why)}")
    nodes = config.sandbox_node_entries()
    for name, node in nodes:
        spawned = isinstance(node, SandboxNodeConfig) and node.spawn
        run_by = " (run by this gateway: spawn = true)" if spawned else ""
        lines.append(f"{name} {node.url}: {node.max_concurrent} slots{run_by}")
    if not nodes:
        lines.append("sandboxes: not configured (executions answer 502)")
    elif len(nodes) > 1:
        capacity = sum(node.max_concurrent for _, node in nodes)
        lines.append(f"sandbox capacity: {capacity} slots on {len(nodes)} nodes")
    return lines


def _state(why_not: str | None) -> str:
    return f"not ready: {why_not}" if why_not else "ready"
