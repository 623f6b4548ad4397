"""Turns a presented API key into its key and project records, or the spec's refusal."""

from __future__ import annotations

import time
from typing import Protocol

from model_gateway.gateway.access import keys
from model_gateway.gateway.cluster.instance import Instance
from model_gateway.pipeline.errors import Forbidden, InvalidApiKey
from model_gateway.storage import AccountsPort, ClusterPort
from model_gateway.storage.base import KeyRecord, ProjectRecord

_CACHE_LIMIT = 10_000


class KeyStore(AccountsPort, ClusterPort, Protocol):
    """What the key ring reads: keys and projects, and the admin epoch that says when its
    cache is stale."""


class KeyRing:
    """Key lookups by prefix, cached until any process changes a key or project.

    The cache is dropped whenever the storage's admin epoch moves, so a revocation or an
    archive (by this process or by the CLI) counts from the very next request. An instance
    that lost its lease (`instance`, gateway/cluster/instance.py) cannot vouch that its cache is
    current: it answers 503 instead, before looking at the key.
    """

    def __init__(self, storage: KeyStore, pepper: bytes, instance: Instance | None = None) -> None:
        self._storage = storage
        self._pepper = pepper
        self._instance = instance
        self._cache: dict[str, tuple[KeyRecord, ProjectRecord]] = {}
        self._epoch = storage.admin_epoch()

    async def authenticate(self, presented: str) -> tuple[KeyRecord, ProjectRecord]:
        if self._instance is not None:
            self._instance.check_serving()
        if not keys.is_well_formed(presented):
            raise InvalidApiKey()
        found = await self._lookup(keys.public_prefix(presented))
        if found is None:
            # Hash anyway, so an unknown prefix costs the same time as a wrong key.
            keys.hash_key(self._pepper, presented)
            raise InvalidApiKey()
        key, project = found
        if not keys.matches(self._pepper, presented, key.key_hash) or key.state != "usable":
            raise InvalidApiKey()
        if key.expires_at is not None and key.expires_at <= time.time():
            raise InvalidApiKey()
        if project.state != "active":
            raise Forbidden("The key's project is archived.")
        return key, project

    async def _lookup(self, prefix: str) -> tuple[KeyRecord, ProjectRecord] | None:
        epoch = self._storage.admin_epoch()
        if epoch != self._epoch:
            self._cache.clear()
            self._epoch = epoch
        cached = self._cache.get(prefix)
        if cached is not None:
            return cached
        key = await self._storage.get_key(prefix)
        if key is None:
            return None  # not cached: unknown prefixes must not fill memory
        project = await self._storage.get_project(key.project_id)
        if project is None:
            return None
        # Cache only what was read under the epoch that is still current: a revocation that
        # landed while we read must not be undone by storing the record read before it.
        if self._storage.admin_epoch() == epoch == self._epoch:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[prefix] = (key, project)
        return key, project
