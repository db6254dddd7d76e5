"""Where client quotas are kept, and the broker's view of them (asyncio shell).

The quotas live where the SCRAM credentials do, so every broker of a cluster applies the
same ones:

* one broker: ``<data dir>/client-quotas.json``, rewritten whole and atomically on
  every change;
* a cluster (``metadata.store=etcd://``): one etcd key per entity,
  ``/shoal/client_quotas/<entity, percent-encoded>``, holding the entity and its values.
  Every broker reads them from its metadata snapshot, which its watch keeps current.

:func:`quota_service` is the broker's :class:`QuotaService` (created on first use): the
measures (``quotas.QuotaManager``) and the stored quotas they apply.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..log.partition_log import atomic_write
from .quotas import Entity, QuotaManager, entity_text

log = logging.getLogger("shoal.security")

__all__ = ["QuotaService", "quota_service"]

_PREFIX = b"/shoal/client_quotas/"


def _entity_key(entity: Entity) -> str:
    return quote(",".join(f"{t}={'%' if n is None else quote(n, safe='')}" for t, n in entity), safe="")


def _to_json(entity: Entity, values: dict[str, float]) -> dict[str, Any]:
    return {"entity": [[t, n] for t, n in entity], "quotas": values}


def _from_json(d: dict[str, Any]) -> tuple[Entity, dict[str, float]]:
    entity = tuple(sorted((str(t), None if n is None else str(n)) for t, n in d["entity"]))
    return entity, {str(k): float(v) for k, v in d["quotas"].items()}


class QuotaService:
    """The broker's quotas: read them (``quotas``), change them (``alter``), and the measures
    that apply them (``manager``, kept current with the stored quotas)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        config = broker.config
        self.manager = QuotaManager(config["quota.window.num"], config["quota.window.size.seconds"] * 1000)
        self._snapshot: Any = None
        self._raw: Any = None
        self._path = Path(broker.data_dir) / "client-quotas.json"
        self._local: dict[Entity, dict[str, float]] = {}
        self._cluster_mode = config["metadata.store"] != "local"
        if not self._cluster_mode and self._path.exists():
            try:
                self._local = dict(_from_json(d) for d in json.loads(self._path.read_text())["entities"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise OSError(f"{self._path} is unreadable ({e}); client quotas cannot be applied") from None
            self.manager.update(self._local)

    @property
    def _clustered(self) -> bool:
        return self._cluster_mode and bool(getattr(self.broker.cluster, "clustered", False))

    def current(self) -> QuotaManager:
        """The measures, with the quotas of the newest metadata (cheap: called per request)."""
        if self._cluster_mode and self._clustered:
            snap = self.broker.cluster.store.snapshot
            if snap is not self._snapshot:
                self._snapshot = snap
                raw = snap.client_quotas
                if raw != self._raw:
                    self._raw = dict(raw)
                    self.manager.update(self._parse(raw))
        return self.manager

    @staticmethod
    def _parse(raw: dict[str, Any]) -> dict[Entity, dict[str, float]]:
        out = {}
        for key, d in raw.items():
            try:
                entity, values = _from_json(d)
            except (ValueError, KeyError, TypeError):
                log.error("ignoring a malformed client quota in etcd: %s", key)
                continue
            out[entity] = values
        return out

    def quotas(self) -> dict[Entity, dict[str, float]]:
        if self._cluster_mode:
            if not self._clustered:
                return {}
            return self._parse(self.broker.cluster.store.snapshot.client_quotas)
        return {e: dict(v) for e, v in self._local.items()}

    async def alter(self, changes: dict[Entity, dict[str, float]]) -> None:
        """Give each entity of ``changes`` its new values (none: remove it). Raises OSError
        when they cannot be stored (then nothing changed)."""
        if self._clustered:
            store = self.broker.cluster.store
            c = store.client
            ops = [c.transactions.delete(_PREFIX + _entity_key(e).encode()) if not v
                   else c.transactions.put(_PREFIX + _entity_key(e).encode(),
                                           json.dumps(_to_json(e, v), sort_keys=True).encode())
                   for e, v in changes.items()]
            try:
                await c.transaction(compare=[], success=ops, failure=[])
            except Exception as e:
                raise OSError(f"writing client quotas to etcd failed: {e}") from e
            try:
                await store.reload()
            except Exception as e:  # the watch brings it soon
                log.warning("reading client quotas back from etcd failed: %s", e)
        else:
            quotas = {e: dict(v) for e, v in self._local.items()}
            for entity, values in changes.items():
                if values:
                    quotas[entity] = dict(values)
                else:
                    quotas.pop(entity, None)
            data = {"version": 1, "entities": [_to_json(e, v) for e, v in sorted(quotas.items(), key=lambda kv:
                                                                                   _entity_key(kv[0]))]}
            atomic_write(self._path, json.dumps(data, indent=1, sort_keys=True).encode())
            self._local = quotas
            self.manager.update(quotas)
        for entity, values in changes.items():
            log.info("client quotas of %s set to %s", entity_text(entity), values or "none")


def quota_service(broker: Any) -> QuotaService:
    """The broker's quota service (created on first use)."""
    service = broker.extensions.get("quotas")
    if service is None:
        service = broker.extensions["quotas"] = QuotaService(broker)
    return service
