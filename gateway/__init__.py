"""A self-hosted, metered, verifiable gateway to model providers and sandboxed code."""


def create_app(config):
    """The gateway as one ASGI app (imported lazily: the CLI and the stages load fast alone)."""
    from model_gateway.gateway.app import create_app as build

    return build(config)


__all__ = ["create_app"]
