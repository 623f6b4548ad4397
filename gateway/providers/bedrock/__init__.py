"""`kind = "bedrock"`: AWS Bedrock Runtime's Converse API (bedrock.py; its translation to
and from chat in converse_translate.py)."""

from model_gateway.gateway.providers.bedrock.bedrock import BedrockProvider as PROVIDER

__all__ = ["PROVIDER"]
