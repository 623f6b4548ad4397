"""`kind = "anthropic"`: Anthropic's Messages API (anthropic.py; its translation to and
from chat in anthropic_messages.py)."""

from model_gateway.gateway.providers.anthropic.anthropic import AnthropicProvider as PROVIDER

__all__ = ["PROVIDER"]
