# `gateway` first: importing a `pipeline` module before it hits a circular import
# (pipeline/__init__ -> stage -> gateway/__init__ -> gateway.app -> pipeline), which
# tests/pipeline/test_imports.py shows on its own. Here it must not hide the stage tests.
import gateway  # noqa: F401
