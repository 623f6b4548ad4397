"""The sandbox node: a separate service that runs untrusted code in isolation.

It shares only the wire protocol (`gateway.sandbox.wire_auth`) with the gateway.
"""
