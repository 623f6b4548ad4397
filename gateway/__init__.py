"""A self-hosted, metered, verifiable gateway to model providers and sandboxed code.

The app factory is `model_gateway.gateway.app.create_app`; this package imports nothing,
so that importing any of its modules never loads the whole application.
"""
