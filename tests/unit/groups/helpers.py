"""A fake shell for the group coordinator shard: appends (to a list) and replays records,
collects responses of parked requests by token, and drives time."""

from __future__ import annotations

import datetime
import importlib
import itertools
import struct
from typing import Any

from shoal.coordinator.records import CoordinatorRecord
from shoal.groups.manager import GroupCoordinatorShard

MS = datetime.timedelta(milliseconds=1)


def req(api: str, version: int, **fields: Any) -> Any:
    """Build a kio request of ``api`` (module name) and version from plain values."""
    from shoal.groups.manager import build_response  # the builder works for any entity

    mod = importlib.import_module(f"kio.schema.{api}.v{version}.request")
    cls = next(
        getattr(mod, n) for n in dir(mod) if n.endswith("Request") and getattr(getattr(mod, n), "__module__", "") == mod.__name__
    )
    return build_response(cls, fields)


def subscription(*topics: str) -> bytes:
    """A ConsumerProtocolSubscription v0 for ``topics``."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


class Shell:
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        counter = itertools.count(1)
        cfg = {"group.initial.rebalance.delay.ms": 0}
        cfg.update(config or {})
        self.shard = GroupCoordinatorShard(cfg, new_member_id=lambda prefix: f"{prefix}-{next(counter)}")
        self.log: list[CoordinatorRecord] = []
        self.replies: dict[Any, Any] = {}
        self.deadlines: list[int] = []
        self.tokens = itertools.count(1)

    def apply(self, result: Any) -> Any:
        for r in result.records:
            # through bytes, as the log would keep them
            k, v = r.to_bytes()
            r2 = CoordinatorRecord.from_bytes(k, v)
            self.log.append(r2)
            self.shard.replay(r2)
        for c in result.after or []:
            assert c.token not in self.replies, "a token was answered twice"
            self.replies[c.token] = c.response
        self.deadlines = list(result.deadlines)
        return result

    def call(self, name: str, request: Any, now_ms: int, **kw: Any) -> Any:
        return self.apply(getattr(self.shard, name)(request, now_ms, **kw))

    def join(self, version: int, now_ms: int, group: str = "g", member_id: str = "", instance: str | None = None,
             protocols: tuple[tuple[str, bytes], ...] = (("range", b"m"),), session_ms: int = 10_000,
             rebalance_ms: int = 30_000, protocol_type: str = "consumer", client_id: str = "c") -> tuple[Any, Any]:
        """Returns (token, immediate response or None)."""
        fields: dict[str, Any] = dict(
            group_id=group, session_timeout=session_ms, rebalance_timeout=rebalance_ms, member_id=member_id,
            group_instance_id=instance, protocol_type=protocol_type,
            protocols=[{"name": n, "metadata": m} for n, m in protocols],
        )
        token = next(self.tokens)
        res = self.call("handle_join_group", req("join_group", version, **fields), now_ms, token=token,
                        client_id=client_id, client_host="/127.0.0.1")
        return token, res.response

    def sync(self, version: int, now_ms: int, member_id: str, generation: int, group: str = "g",
             instance: str | None = None, assignments: dict[str, bytes] | None = None,
             protocol_type: str | None = None, protocol_name: str | None = None) -> tuple[Any, Any]:
        token = next(self.tokens)
        r = req("sync_group", version, group_id=group, generation_id=generation, member_id=member_id,
                group_instance_id=instance, protocol_type=protocol_type, protocol_name=protocol_name,
                assignments=[{"member_id": k, "assignment": v} for k, v in (assignments or {}).items()])
        res = self.call("handle_sync_group", r, now_ms, token=token)
        return token, res.response

    def heartbeat(self, version: int, now_ms: int, member_id: str, generation: int, group: str = "g",
                  instance: str | None = None) -> Any:
        r = req("heartbeat", version, group_id=group, generation_id=generation, member_id=member_id,
                group_instance_id=instance)
        return self.call("handle_heartbeat", r, now_ms).response.error_code

    def expire(self, now_ms: int) -> Any:
        return self.apply(self.shard.expire(now_ms))

    def answer(self, token: Any, immediate: Any = None) -> Any:
        return immediate if immediate is not None else self.replies.get(token)

    def commit(self, version: int, now_ms: int, offsets: dict[tuple[str, int], int], group: str = "g",
               member_id: str = "", generation: int = -1, instance: str | None = None,
               metadata: str | None = "meta", retention_ms: int = -1) -> dict[tuple[str, int], Any]:
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (t, p), o in offsets.items():
            by_topic.setdefault(t, []).append(
                {"partition_index": p, "committed_offset": o, "committed_leader_epoch": 3, "committed_metadata": metadata})
        r = req("offset_commit", version, group_id=group, generation_id_or_member_epoch=generation,
                member_id=member_id, group_instance_id=instance, retention_time=retention_ms,
                topics=[{"name": t, "partitions": ps} for t, ps in by_topic.items()])
        resp = self.call("handle_offset_commit", r, now_ms).response
        return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


def stable_group(sh: Shell, n: int = 3, version: int = 9, now: int = 0, group: str = "g",
                 topics: tuple[str, ...] = ("t",)) -> tuple[list[str], int]:
    """Bring ``n`` dynamic members to a STABLE group; returns (member ids, generation)."""
    members = []
    tokens = []
    for i in range(n):
        _, resp = sh.join(version, now, group=group, protocols=(("range", subscription(*topics)),), client_id=f"c{i}")
        members.append(resp.member_id)
    for mid in members:
        tok, resp = sh.join(version, now, group=group, member_id=mid, protocols=(("range", subscription(*topics)),))
        assert resp is None
        tokens.append(tok)
    sh.expire(now)  # initial rebalance delay (0 in tests) elapses
    gen = sh.replies[tokens[0]].generation_id
    leader = sh.replies[tokens[0]].leader
    sync_tokens = {}
    for mid in members:
        if mid != leader:
            tok, resp = sh.sync(5, now, mid, gen, group=group)
            assert resp is None
            sync_tokens[mid] = tok
    _, resp = sh.sync(5, now, leader, gen, group=group, assignments={m: m.encode() for m in members})
    assert resp.error_code == 0 and resp.assignment == leader.encode()
    for mid, tok in sync_tokens.items():
        assert sh.replies[tok].assignment == mid.encode()
    return members, gen
