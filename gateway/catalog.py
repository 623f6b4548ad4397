"""The configured models, and which of them a key and its project may use."""

from __future__ import annotations

from gateway.config import Config, ModelConfig
from storage.base import KeyRecord, ProjectRecord


class ModelCatalog:
    def __init__(self, config: Config) -> None:
        self.models = config.models
        self.providers = config.providers

    def get(self, model_id: str) -> ModelConfig | None:
        return self.models.get(model_id)

    @staticmethod
    def allowed(model_id: str, key: KeyRecord | None, project: ProjectRecord) -> bool:
        if project.allow_models is not None and model_id not in project.allow_models:
            return False
        if model_id in project.exclude_models:
            return False
        return key is None or key.models is None or model_id in key.models

    def available(self, model: ModelConfig) -> bool:
        return model.available and self.providers[model.provider].configured

    def visible_to(
        self, key: KeyRecord | None, project: ProjectRecord
    ) -> list[tuple[str, ModelConfig]]:
        return [(mid, m) for mid, m in self.models.items() if self.allowed(mid, key, project)]
