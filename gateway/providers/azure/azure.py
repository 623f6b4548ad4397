"""Azure OpenAI: OpenAI's protocol on a deployment's path, with the `api-key` header.

`{base_url}/openai/deployments/{deployment}/chat/completions?api-version=V` (and
`/embeddings`); the deployment is the model's `upstream` name. Chat passes through as
for any OpenAI-compatible server. Azure's deployment paths have no Responses endpoint:
Responses requests are translated to chat.
"""

from __future__ import annotations

from urllib.parse import quote

from model_gateway.gateway.providers.openai.openai import OpenAIProvider


class AzureProvider(OpenAIProvider):
    kind = "azure"
    native_responses = False

    def headers(self) -> dict[str, str]:
        credential = self.config.credential()
        return {"api-key": credential} if credential else {}

    def path(self, operation: str, model: str) -> str:
        deployment = quote(model, safe="")
        version = quote(self.config.api_version, safe="")
        return f"/openai/deployments/{deployment}/{operation}?api-version={version}"
