"""Requests-per-minute limits: in memory, in PostgreSQL, or in Redis (`[ratelimit]`)."""
