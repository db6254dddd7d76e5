"""Group requests of the admin tools, sent where Kafka's admin client sends them.

A group lives on one coordinator (in a cluster, the leader of its ``__consumer_offsets``
partition), which may not be the broker the tool was pointed at, and moves when that
leader changes. :class:`GroupClient` therefore:

* finds each group's coordinator with FindCoordinator (asked of the bootstrap broker, or
  of any broker it knows when that one is gone) and sends the group's requests there,
  over a connection of its own to that broker (kept for the other groups it coordinates);
* retries with a short backoff when the answer is NOT_COORDINATOR,
  COORDINATOR_LOAD_IN_PROGRESS or COORDINATOR_NOT_AVAILABLE, or when the coordinator
  cannot be reached (it just moved, or died and its partitions are being re-elected),
  asking FindCoordinator again each time, until ``--timeout`` has passed;
* lists groups by asking every broker of the cluster (Metadata names them) with
  ListGroups, which answers only for the groups that broker coordinates, and merges.

On a single broker all of this is one connection: the broker is every coordinator.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from ..errors import ErrorCode
from .common import CliError, reach, timeout_s, verbose

__all__ = ["RETRIABLE", "GroupClient"]

FIND_COORDINATOR, METADATA, LIST_GROUPS = 10, 3, 16
RETRIABLE = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress,
                       ErrorCode.coordinator_not_available})
BACKOFF_S = (0.05, 0.1, 0.2, 0.5)


class GroupClient:
    def __init__(self, args: argparse.Namespace, client_id: str) -> None:
        self.args = args
        self.client_id = client_id
        self.budget_s = timeout_s(args)
        self.bootstrap = reach(args, client_id)
        self._conns: dict[tuple[str, int], Any] = {(self.bootstrap.host, self.bootstrap.port): self.bootstrap}
        self._coordinators: dict[str, tuple[str, int]] = {}

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    # -- connections -------------------------------------------------------------------
    def connection(self, host: str, port: int) -> Any:
        """An open connection to ``host:port`` (opened once, reopened after a failure)."""
        from ..client.connection import Connection

        conn = self._conns.get((host, port))
        if conn is not None and conn.connected:
            return conn
        conn = Connection(host, port, client_id=self.bootstrap.client_id, timeout_s=self.budget_s,
                          security=self.bootstrap.security)
        conn.connect()
        self._conns[(host, port)] = conn
        verbose(self.args, f"connected to {host}:{port}")
        return conn

    def _any(self) -> Any:
        """A connection to some live broker: the bootstrap one, else any other this client knows."""
        if self.bootstrap.connected:
            return self.bootstrap
        for (host, port), conn in list(self._conns.items()):
            if conn.connected:
                return conn
            try:
                return self.connection(host, port)
            except OSError:
                continue
        self.bootstrap.connect()
        return self.bootstrap

    def brokers(self) -> list[tuple[int, str, int]]:
        """(node id, host, port) of every broker of the cluster, from Metadata."""
        conn = self._any()
        resp = conn.call(METADATA, conn.version_for(METADATA, 1, 12), topics=(),
                         allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        return sorted((int(b.node_id), b.host, int(b.port)) for b in resp.brokers)

    # -- coordinators ----------------------------------------------------------------------
    def coordinator(self, group: str) -> tuple[str, int]:
        """(host, port) of ``group``'s coordinator; ApiError-free: raises CliError past the timeout."""
        known = self._coordinators.get(group)
        if known is not None:
            return known
        conn = self._any()
        version = conn.version_for(FIND_COORDINATOR, 0, 6)
        if version >= 4:
            c = conn.call(FIND_COORDINATOR, version, key_type=0, coordinator_keys=(group,)).coordinators[0]
        else:
            c = conn.call(FIND_COORDINATOR, version, key=group, key_type=0)
        code = ErrorCode(int(c.error_code))
        if code is not ErrorCode.none:
            raise _Retry(code)
        self._coordinators[group] = (c.host, int(c.port))
        verbose(self.args, f"group {group}: coordinator {c.node_id} at {c.host}:{c.port}")
        return c.host, int(c.port)

    def call(self, group: str, send: Callable[[Any], Any], error_of: Callable[[Any], Any]) -> Any:
        """``send(connection to group's coordinator)``, again (after FindCoordinator and a short
        backoff) while ``error_of(response)`` is retriable or the coordinator cannot be
        reached, until ``--timeout``. Returns the last response."""
        deadline = time.monotonic() + self.budget_s
        attempt = 0
        while True:
            reason: str
            try:
                host, port = self.coordinator(group)
                resp = send(self.connection(host, port))
                code = ErrorCode(int(error_of(resp) or 0))
                if code not in RETRIABLE:
                    return resp
                reason = code.name
                if time.monotonic() >= deadline:
                    return resp
            except _Retry as e:
                reason = e.code.name
            except (OSError, ConnectionError) as e:
                reason = f"cannot reach the coordinator ({e})"
                self._drop_closed()
            self._coordinators.pop(group, None)
            if time.monotonic() >= deadline:
                raise CliError(f"group {group}: no coordinator answered within {int(self.budget_s * 1000)} ms "
                               f"({reason})")
            verbose(self.args, f"group {group}: {reason}; finding its coordinator again")
            time.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
            attempt += 1

    def _drop_closed(self) -> None:
        for key in [k for k, c in self._conns.items() if not c.connected and c is not self.bootstrap]:
            del self._conns[key]

    # -- every broker -------------------------------------------------------------------
    def list_groups(self, **fields: Any) -> list[Any]:
        """ListGroups of every broker, merged by group id (each broker lists the groups it
        coordinates). A broker that answers a retriable error or cannot be reached is asked
        again until ``--timeout``."""
        deadline = time.monotonic() + self.budget_s
        found: dict[str, Any] = {}
        pending = self.brokers()
        attempt = 0
        while pending:
            failed = []
            for node_id, host, port in pending:
                try:
                    conn = self.connection(host, port)
                    resp = conn.call(LIST_GROUPS, conn.version_for(LIST_GROUPS, 0, 5), **fields)
                except (OSError, ConnectionError) as e:
                    failed.append(((node_id, host, port), f"cannot reach broker {node_id} ({e})"))
                    self._drop_closed()
                    continue
                code = ErrorCode(int(resp.error_code))
                if code in RETRIABLE:
                    failed.append(((node_id, host, port), code.name))
                    continue
                if code is not ErrorCode.none:
                    raise CliError(f"broker {node_id} cannot list its groups: {code.name}")
                for g in resp.groups:
                    found.setdefault(str(g.group_id), g)
            if not failed:
                break
            if time.monotonic() >= deadline:
                raise CliError("cannot list every broker's groups: "
                               + "; ".join(reason for _b, reason in failed))
            # the cluster may have changed (a broker died): ask Metadata again
            time.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
            attempt += 1
            try:
                live = set(self.brokers())
            except (OSError, ConnectionError):
                live = {b for b, _r in failed}
            pending = [b for b, _r in failed if b in live]
        return [found[g] for g in sorted(found)]


class _Retry(Exception):
    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code
