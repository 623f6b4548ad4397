"""Upstream providers behind one interface (`base.Provider`), one module per kind."""

from __future__ import annotations

from model_gateway.gateway.config import Config, ProviderConfig
from model_gateway.gateway.providers.anthropic import AnthropicProvider
from model_gateway.gateway.providers.echo import EchoProvider
from model_gateway.gateway.providers.openai import OpenAIProvider
from model_gateway.gateway.providers.upstream import Provider, ResponsesUnsupported
from model_gateway.gateway.routing.breaker import Breakers

KINDS: dict[str, type[Provider]] = {
    "echo": EchoProvider,
    "openai": OpenAIProvider,
    "anthropic": AnthropicProvider,
}

__all__ = ["Provider", "Providers", "ResponsesUnsupported", "build_provider"]


def build_provider(name: str, config: ProviderConfig) -> Provider:
    return KINDS[config.kind](name, config)


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
