"""API keys: their format and hashes, and the key ring that looks them up."""
