"""The host application's own `storage` module: it must not shadow the gateway's."""

HOST_MARKER = "the host's storage"
