"""`kind = "gemini"`: Google's Gemini API (gemini.py; its translation to and from chat in
gemini_translate.py)."""

from model_gateway.gateway.providers.gemini.gemini import GeminiProvider as PROVIDER

__all__ = ["PROVIDER"]
