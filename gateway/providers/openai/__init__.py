"""`kind = "openai"`: any OpenAI-compatible server (openai.py)."""

from model_gateway.gateway.providers.openai.openai import OpenAIProvider as PROVIDER

__all__ = ["PROVIDER"]
