"""Routing resilience: which provider to try next, and which ones to leave alone a while."""
