"""Upstream providers behind one interface (`upstream.Provider`), one folder per kind.

A kind's folder exports its `Provider` subclass as `PROVIDER`; the registry below names
the folder. A kind is imported only when a provider of that kind is configured, so the
vendor libraries some kinds need (botocore, google-auth) load only then.
"""

from __future__ import annotations

import importlib

from model_gateway.gateway.config import Config, ProviderConfig
from model_gateway.gateway.providers.upstream import Provider, ResponsesUnsupported
from model_gateway.gateway.routing.breaker import Breakers

# kind -> its folder under gateway/providers/
KINDS: dict[str, str] = {
    "echo": "echo",
    "openai": "openai",
    "anthropic": "anthropic",
    "azure": "azure",
    "gemini": "gemini",
    "vertex": "vertex",
    "bedrock": "bedrock",
}

__all__ = ["Provider", "Providers", "ResponsesUnsupported", "build_provider"]


def provider_class(kind: str) -> type[Provider]:
    module = importlib.import_module(f"{__name__}.{KINDS[kind]}")
    cls: type[Provider] = module.PROVIDER
    return cls


def build_provider(name: str, config: ProviderConfig) -> Provider:
    return provider_class(config.kind)(name, config)


class Providers:
    """Every configured provider by name; sessions opened at start, closed at stop."""

    def __init__(self, config: Config) -> None:
        self._by_name = {name: build_provider(name, cfg) for name, cfg in config.providers.items()}
        routing = config.routing
        self.breakers = Breakers(
            self._by_name, routing.breaker_failures, routing.breaker_cooldown_s
        )

    def __getitem__(self, name: str) -> Provider:
        return self._by_name[name]

    async def start(self) -> None:
        for provider in self._by_name.values():
            await provider.start()

    async def close(self) -> None:
        for provider in self._by_name.values():
            await provider.close()
