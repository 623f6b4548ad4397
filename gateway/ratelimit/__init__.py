"""Requests and tokens per minute: in memory, in PostgreSQL, or in Redis (`[ratelimit]`)."""
