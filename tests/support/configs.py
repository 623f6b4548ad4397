"""Configuration texts shared by tests that build the app in process."""

# The embedded defaults: SQLite and secrets under data/ of the test's folder.
EMBEDDED = """
[storage]
url = "sqlite:///data/gateway.db"
[secrets]
key_pepper_file = "data/key-pepper"
signing_key_file = "data/signing-key"
"""
