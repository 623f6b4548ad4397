"""A self-hosted, metered, verifiable gateway to model providers and sandboxed code."""

from gateway.app import create_app

__all__ = ["create_app"]
