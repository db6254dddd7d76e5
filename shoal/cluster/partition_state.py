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
  the leader it elected is gone even when the restart was quicker than the session timeout;
* ``adding`` and ``removing``: an ongoing reassignment (Kafka's addingReplicas and
  removingReplicas). While it runs, ``replicas`` is the target followed by the replicas
  being removed; the target is ``replicas`` minus ``removing``, the replica set from before
  it ``replicas`` minus ``adding``.

Reassignment (AlterPartitionReassignments, Kafka's rules):

* starting one from replicas ``R`` to a target ``T`` writes replicas ``T + (R - T)``,
  adding ``T - R``, removing ``R - T``; the ISR and leader stay. The added replicas fetch
  as followers and join the ISR once caught up, as any follower does;
* once every target replica is in the ISR (and one of them can lead), the controller
  completes it: replicas ``T``, ISR minus the removed replicas, and a new leader from the
  target if the leader is not in it;
* cancelling reverts: replicas minus ``adding``, ISR minus ``adding``, a new leader if the
  leader was one of the added replicas. Refused if no replica of the reverted ISR remains.

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

__all__ = [
    "PartitionState",
    "ReassignmentError",
    "cancel_reassignment",
    "choose_leader",
    "complete_reassignment",
    "expand_isr",
    "initial_state",
    "reconcile",
    "shrink_isr",
    "start_reassignment",
]

NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class PartitionState:
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    leader_registration: int = 0
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    def to_json(self) -> bytes:
        d: dict[str, Any] = {"replicas": list(self.replicas), "isr": list(self.isr), "leader": self.leader,
                             "leader_epoch": self.leader_epoch, "partition_epoch": self.partition_epoch,
                             "leader_registration": self.leader_registration}
        if self.adding or self.removing:
            d["adding"], d["removing"] = list(self.adding), list(self.removing)
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> PartitionState:
        d = json.loads(data) if isinstance(data, (bytes, str)) else data
        return cls(tuple(d["replicas"]), tuple(d["isr"]), int(d["leader"]), int(d["leader_epoch"]),
                   int(d["partition_epoch"]), int(d.get("leader_registration", 0)),
                   tuple(d.get("adding", ())), tuple(d.get("removing", ())))

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def target(self) -> tuple[int, ...]:
        """The replica set this partition ends with (the replicas when no reassignment runs)."""
        return tuple(r for r in self.replicas if r not in self.removing)

    def _next(self, **changes: Any) -> PartitionState:
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


class ReassignmentError(ValueError):
    """A reassignment that cannot be made (Kafka's INVALID_REPLICA_ASSIGNMENT or NO_REASSIGNMENT_IN_PROGRESS)."""

    def __init__(self, message: str, *, none_in_progress: bool = False) -> None:
        super().__init__(message)
        self.none_in_progress = none_in_progress


def start_reassignment(state: PartitionState, target: Sequence[int]) -> PartitionState | None:
    """Move the partition to the replica set ``target`` (in preference order); None if it is there.

    Replaces an ongoing reassignment (computed from the current replicas, the ones being
    added included, as Kafka does). A target with the current replicas in another order
    only reorders them. Raises ReassignmentError for an empty target or a duplicate.
    """
    target = tuple(target)
    if not target:
        raise ReassignmentError("the target replica list is empty")
    if len(set(target)) != len(target):
        raise ReassignmentError(f"duplicate broker in {list(target)}")
    current = state.replicas
    adding = tuple(r for r in target if r not in current)
    removing = tuple(r for r in current if r not in target)
    if not adding and not removing:
        if target == current and not state.reassigning:
            return None
        return state._next(replicas=target, adding=(), removing=())
    return state._next(replicas=target + removing, adding=adding, removing=removing)


def _new_leader_among(state: PartitionState, live: Mapping[int, int], shutting_down: Collection[int]) -> PartitionState:
    """``state`` with a leader from its replicas and ISR if its leader is no longer a replica."""
    if state.leader in state.replicas:
        return state
    new = choose_leader(state, live, exclude=shutting_down)
    if new is None:
        return replace(state, leader=NO_LEADER, leader_epoch=state.leader_epoch + 1, leader_registration=0)
    return replace(state, leader=new, leader_epoch=state.leader_epoch + 1, leader_registration=live[new])


def complete_reassignment(state: PartitionState, live: Mapping[int, int], *,
                          shutting_down: Collection[int] = ()) -> PartitionState | None:
    """The controller's step: finish an ongoing reassignment whose target replicas are all in the ISR.

    None while it must wait (or when none runs). The leader moves to the target if it is
    not in it; the reassignment waits while no target replica could lead.
    """
    if not state.reassigning:
        return None
    target = state.target
    if any(r not in state.isr for r in target):
        return None
    if state.leader not in target and choose_leader(
            replace(state, replicas=target), live, exclude=shutting_down) is None:
        return None
    isr = tuple(r for r in state.isr if r in target)
    done = state._next(replicas=target, isr=isr, adding=(), removing=())
    return _new_leader_among(done, live, shutting_down)


def cancel_reassignment(state: PartitionState, live: Mapping[int, int], *,
                        shutting_down: Collection[int] = ()) -> PartitionState:
    """Revert an ongoing reassignment to the replicas from before it.

    Raises ReassignmentError(none_in_progress) when none runs, ReassignmentError when
    no replica of the ISR would remain.
    """
    if not state.reassigning:
        raise ReassignmentError("no reassignment is in progress", none_in_progress=True)
    replicas = tuple(r for r in state.replicas if r not in state.adding)
    isr = tuple(r for r in state.isr if r not in state.adding)
    if not isr:
        raise ReassignmentError("cancelling would leave the partition without an in-sync replica")
    reverted = state._next(replicas=replicas, isr=isr, adding=(), removing=())
    return _new_leader_among(reverted, live, shutting_down)
