"""A fake Azure OpenAI resource: OpenAI's chat and embeddings (FakeOpenAI's, modes and
all) on a deployment's path, `/openai/deployments/{deployment}/chat/completions` and
`.../embeddings`, with `?api-version=` required.

As Azure does, it checks the `api-key` header (401 with Azure's message when wrong or
missing) and the api-version (404 "Resource not found" when missing or not the one it
serves), and answers as the deployment named in the path, whatever the body's `model`
says: the fault mode is the deployment's name. It has no Responses endpoint.
"""

from __future__ import annotations

from aiohttp import web

from tests.support.fake_openai import FakeOpenAI

API_VERSION = "2024-10-21"
AZURE_CREDENTIAL = "azure-fake-resource-key-41d7c2"
_DENIED = (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to "
    "provide a valid key for an active subscription and use a correct regional API "
    "endpoint for your resource."
)


def _azure_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"code": str(status), "message": message}}, status=status)


class FakeAzure(FakeOpenAI):
    def __init__(self, credential: str = AZURE_CREDENTIAL, api_version: str = API_VERSION) -> None:
        super().__init__(credential)
        self.api_version = api_version

    def routes(self) -> list[web.RouteDef]:
        deployment = "/openai/deployments/{deployment}"
        return [
            web.post(deployment + "/chat/completions", self.chat),
            web.post(deployment + "/embeddings", self.embeddings),
            web.post("/stolen", self.stolen),
        ]

    def provider_config(self, name: str) -> tuple[str, dict[str, str]]:
        block = f"""
[providers."{name}"]
kind = "azure"
base_url = "{self.url}"
api_key_env = "FAKE_AZURE_KEY"
api_version = "{self.api_version}"
"""
        return block, {"FAKE_AZURE_KEY": self.credential}

    async def _admit(self, request: web.Request) -> tuple[dict, web.StreamResponse | None]:
        body = await self.record(request)
        if request.headers.get("api-key") != self.credential:
            return body, _azure_error(401, _DENIED)
        if request.query.get("api-version") != self.api_version:
            return body, _azure_error(404, "Resource not found")
        deployment = request.match_info["deployment"]
        # The deployment decides, as on Azure; the recorded body stays as it was sent.
        return {**body, "model": deployment}, await self.before_answer(request, deployment)
