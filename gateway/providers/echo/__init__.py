"""The built-in echo provider: needs nothing, answers deterministically (echo.py)."""

from model_gateway.gateway.providers.echo.echo import EchoProvider as PROVIDER

__all__ = ["PROVIDER"]
