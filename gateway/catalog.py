"""The configured models, and which of them a key and its project may use."""

from __future__ import annotations

from model_gateway.gateway.config import Config, ModelConfig
from model_gateway.pipeline.policy import model_allowed
from model_gateway.pipeline.ports import KeyInfo, ModelInfo, ProjectInfo


class ConfigCatalog:
    """The pipeline's `ModelCatalog` over the configuration's models and providers."""

    def __init__(self, config: Config) -> None:
        self.models = config.models
        self.providers = config.providers
        self._aliases = {
            alias: model_id for model_id, model in self.models.items() for alias in model.aliases
        }

    def resolve(self, name: str) -> tuple[str, ModelConfig] | None:
        model_id = self._aliases.get(name, name)
        model = self.models.get(model_id)
        return None if model is None else (model_id, model)

    def available(self, model: ModelInfo) -> bool:
        assert isinstance(model, ModelConfig)
        # Any provider of the chain with its credential can serve (the attempts skip the rest).
        chain = [model.provider, *(fallback.provider for fallback in model.fallbacks)]
        return model.available and any(self.providers[name].configured for name in chain)

    def visible_to(
        self, key: KeyInfo | None, project: ProjectInfo
    ) -> list[tuple[str, ModelConfig]]:
        return [(mid, m) for mid, m in self.models.items() if model_allowed(mid, key, project)]
