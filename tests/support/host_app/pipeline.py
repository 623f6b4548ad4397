"""The host application's own `pipeline` module: it must not shadow the gateway's."""

HOST_MARKER = "the host's pipeline"
