"""A partition's leadership record and the transitions allowed on it (pure).

Theory of operation
-------------------
The record a cluster keeps per partition (in etcd, as Kafka keeps it in KRaft's
PartitionRecord/PartitionChangeRecord):

* ``replicas``: the assigned brokers, preferred leader first;
* ``isr``: the in-sync replicas; an acknowledged acks=all record is on every one of them;
* ``leader`` (-1 when none is possible) and ``leader_epoch``, raised at every leader change;
* ``partition_epoch``, raised at every change of any kind. A writer compares it (through
  the key's mod revision in etcd) before writing, so a stale decision never overwrites a
  newer one;
* ``leader_registration``: the registration epoch of the leader's broker when it became
  leader. A broker that restarts registers with a new epoch, so the controller sees that
  the leader it elected is gone even when the restart was quicker than the session timeout.

Rules (Kafka's, with ``unclean.leader.election.enable=false``):

* a new leader is always chosen from the ISR, in the replicas' (preference) order, among
  live brokers that are not shutting down; if there is none the partition has no leader
  (-1) and keeps its last ISR, so the last in-sync replica is elected when it returns;
* the ISR never becomes empty, and a leader is always in its own ISR;
* a broker that died, restarted, or is shutting down leaves the ISR of partitions that
  elect another leader; a follower that is no longer registered leaves the ISR;
* the leader shrinks the ISR (a follower that lagged past ``replica.lag.time.max.ms``) and
  expands it (a follower that reached the high watermark); both are its own writes.

Every function returns the new state, or None when nothing changes. Nothing here knows
about etcd, time or sockets.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["PartitionState", "initial_state", "choose_leader", "reconcile", "shrink_isr", "expand_isr"]

NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class PartitionState:
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    leader_registration: int = 0

    def to_json(self) -> bytes:
        return json.dumps({"replicas": list(self.replicas), "isr": list(self.isr), "leader": self.leader,
                           "leader_epoch": self.leader_epoch, "partition_epoch": self.partition_epoch,
                           "leader_registration": self.leader_registration}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> "PartitionState":
        d = json.loads(data) if isinstance(data, (bytes, str)) else data
        return cls(tuple(d["replicas"]), tuple(d["isr"]), int(d["leader"]), int(d["leader_epoch"]),
                   int(d["partition_epoch"]), int(d.get("leader_registration", 0)))

    def _next(self, **changes: Any) -> "PartitionState":
        return replace(self, partition_epoch=self.partition_epoch + 1, **changes)


def initial_state(replicas: Sequence[int], live: Mapping[int, int]) -> PartitionState:
    """A new partition: ISR = its live replicas, leader = the first of them (-1 if none is live)."""
    isr = tuple(r for r in replicas if r in live) or tuple(replicas[:1])
    leader = next((r for r in replicas if r in live), NO_LEADER)
    return PartitionState(tuple(replicas), isr, leader, 0, 0, live.get(leader, 0))


def choose_leader(state: PartitionState, live: Mapping[int, int], *,
                  exclude: Collection[int] = ()) -> int | None:
    """The first replica (preference order) that is in the ISR, live and not excluded; None if none."""
    for r in state.replicas:
        if r in state.isr and r in live and r not in exclude:
            return r
    return None


def _leader_alive(state: PartitionState, live: Mapping[int, int]) -> bool:
    return state.leader != NO_LEADER and live.get(state.leader) == state.leader_registration


def reconcile(state: PartitionState, live: Mapping[int, int], *, shutting_down: Collection[int] = (),
              prefer: bool = False) -> PartitionState | None:
    """The controller's decision for one partition; None when it stays as it is.

    ``live`` maps each registered broker to its registration epoch; ``shutting_down``
    names brokers in controlled shutdown; ``prefer`` moves leadership back to the
    preferred replica (replicas[0]) when it is live, in the ISR and not shutting down.
    """
    leader_ok = _leader_alive(state, live) and state.leader not in shutting_down
    if leader_ok:
        if prefer:
            preferred = state.replicas[0]
            if (preferred != state.leader and preferred in state.isr and preferred in live
                    and preferred not in shutting_down):
                return state._next(leader=preferred, leader_epoch=state.leader_epoch + 1,
                                   leader_registration=live[preferred])
        isr = tuple(r for r in state.isr if r in live and (r not in shutting_down or r == state.leader))
        if isr != state.isr and state.leader in isr:
            return state._next(isr=isr)
        return None
    # the leader died, restarted, is shutting down, or there was none
    old = state.leader
    new = choose_leader(state, live, exclude=set(shutting_down) | {old})
    if new is None and old != NO_LEADER and old in live and old in state.isr:
        # nobody else is in sync: the old leader stays (restarted: under a new epoch) if it is live
        if old in shutting_down and _leader_alive(state, live):
            return None  # Kafka keeps a shutting-down broker leader when it has no alternative
        new = old
    if new is None:
        if state.leader == NO_LEADER:
            return None
        # keep the ISR as it was, so its last member is elected when it comes back
        return state._next(leader=NO_LEADER, leader_epoch=state.leader_epoch + 1, leader_registration=0)
    isr = tuple(r for r in state.isr
                if r == new or (r in live and r not in shutting_down and r != old))
    return state._next(leader=new, leader_epoch=state.leader_epoch + 1, isr=isr, leader_registration=live[new])


def shrink_isr(state: PartitionState, leader: int, leader_epoch: int,
               out_of_sync: Collection[int]) -> PartitionState | None:
    """The leader removes lagging followers; None if it is not that leader or nothing changes."""
    if state.leader != leader or state.leader_epoch != leader_epoch:
        return None
    isr = tuple(r for r in state.isr if r == leader or r not in out_of_sync)
    return state._next(isr=isr) if isr != state.isr else None


def expand_isr(state: PartitionState, leader: int, leader_epoch: int, caught_up: int) -> PartitionState | None:
    """The leader adds a follower that reached the high watermark; None if not applicable."""
    if (state.leader != leader or state.leader_epoch != leader_epoch or caught_up in state.isr
            or caught_up not in state.replicas):
        return None
    isr = tuple(r for r in state.replicas if r in state.isr or r == caught_up)
    return state._next(isr=isr)
