"""The leader's replication rules (pure): high watermark, caught-up followers, lagging ones.

* The high watermark is the smallest log end offset among the in-sync replicas, the
  leader's own included; it never goes down. A follower whose log end offset the leader
  has not heard yet (it just became leader) counts at the current high watermark.
* A follower is *caught up* at a fetch when it asked for the leader's log end offset, or
  for at least the log end offset the leader had at the follower's previous fetch (then
  it was caught up at that previous fetch's time): Kafka's ``Replica.updateFetchState``.
* A follower in the ISR that has not been caught up for ``replica.lag.time.max.ms`` is
  lagging and leaves the ISR.
* Only a valid follower Fetch moves that follower's state (``follower_fetch_error``, Kafka's
  ``Partition.fetchRecords`` and ``Replica.updateFetchStateOrThrow``): the replica id must
  be one of the partition's replicas other than the leader (else UNKNOWN_LEADER_EPOCH when
  the request names a current leader epoch, NOT_LEADER_OR_FOLLOWER when it does not), the
  fetch offset within [log start, leader's log end offset] (else OFFSET_OUT_OF_RANGE), and
  the broker epoch the follower sends (Fetch v15+ ``replica_state.replica_epoch``; -1 skips
  the check) the registration epoch the cluster metadata holds for it, when it holds one
  (else NOT_LEADER_OR_FOLLOWER: a fetch from an earlier incarnation of that broker).
  Registration epochs are etcd lease ids, which are not ordered across etcd members, so
  any other epoch is refused where Kafka refuses only an older one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from ..errors import ErrorCode

__all__ = ["caught_up_at", "follower_fetch_error", "high_watermark", "lagging"]


def high_watermark(old_hw: int, leader_leo: int, leader: int, isr: Iterable[int],
                   follower_leo: Mapping[int, int]) -> int:
    """The new high watermark (never below ``old_hw``)."""
    hw = leader_leo
    for b in isr:
        if b != leader:
            hw = min(hw, follower_leo.get(b, old_hw))
    return max(old_hw, hw)


def caught_up_at(fetch_offset: int, leader_leo: int, last_fetch_leo: int | None, last_fetch_ms: int | None,
                 now_ms: int) -> int | None:
    """When the fetching follower was last caught up, as this fetch proves; None if it does not."""
    if fetch_offset >= leader_leo:
        return now_ms
    if last_fetch_leo is not None and fetch_offset >= last_fetch_leo:
        return last_fetch_ms if last_fetch_ms is not None else now_ms
    return None


def lagging(isr: Iterable[int], leader: int, caught_up_ms: Mapping[int, int], now_ms: int, lag_ms: int) -> list[int]:
    """The ISR followers not caught up for more than ``lag_ms`` (unknown ones count as caught up now)."""
    return [b for b in isr if b != leader and now_ms - caught_up_ms.get(b, now_ms) > lag_ms]


def follower_fetch_error(follower: int, fetch_offset: int, *, leader: int, replicas: Collection[int],
                         log_start: int, leader_leo: int, names_leader_epoch: bool, replica_epoch: int = -1,
                         registered_epoch: int | None = None) -> ErrorCode:
    """ErrorCode.none when a follower's Fetch may be served and move its state, else the error."""
    if follower == leader or follower not in replicas:
        return ErrorCode.unknown_leader_epoch if names_leader_epoch else ErrorCode.not_leader_or_follower
    if not log_start <= fetch_offset <= leader_leo:
        return ErrorCode.offset_out_of_range
    if replica_epoch != -1 and registered_epoch is not None and replica_epoch != registered_epoch:
        return ErrorCode.not_leader_or_follower
    return ErrorCode.none
