"""kafka-dump-log (Kafka's DumpLogSegments) on shoal's own segment files.

A workload of a classic group, a KIP-848 consumer group and share groups (with releases
that reach the delivery count limit) runs against a shoal broker; the broker stops, and
Kafka's decoders read every segment of ``__consumer_offsets`` (``--offsets-decoder``) and
``__share_group_state`` (``--share-group-state-decoder``). Every record must decode, and
decode to the values shoal meant: the committed offsets the tools reported, the members
and assignments of the groups, the share-partition start offsets.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shoal.groups.metadata_hash import metadata_hash
from tests.reference.conftest import SHOAL_OVERRIDES
from tests.reference.driver import parse
from tests.support.broker import BrokerProcess
from tests.support.kafka_ref import run_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

# Kafka's ConsumerGroupMember / ShareGroupMember MemberState numbering (records 8 and 14).
MEMBER_STATE_STABLE = 0


@dataclass
class Dumped:
    offset: int
    key: Any  # the decoded key (a dict), or the decoder's text when it could not decode
    value: Any  # the decoded value, None for a tombstone, or the decoder's text

    @property
    def type(self) -> int | None:
        return int(self.key["type"]) if isinstance(self.key, dict) else None


def dump(files: list[Path], decoder: str) -> tuple[list[Dumped], str]:
    proc = run_tool("kafka-dump-log", "--files", ",".join(str(f) for f in files), decoder, timeout=180)
    out: list[Dumped] = []
    for line in proc.stdout.splitlines():
        if not line.startswith("| offset: "):
            continue
        offset = int(line.split()[2])
        _, _, rest = line.partition(" key: ")
        key_text, _, value_text = rest.partition(" payload: ")
        out.append(Dumped(offset, _json(key_text), None if value_text == "<DELETE>" else _json(value_text)))
    return out, proc.stdout


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory, java, kafka_classpath: str) -> dict[str, Any]:
    """Run the groups against shoal, stop it, and return what the clients and tools reported."""
    data = tmp_path_factory.mktemp("dump") / "data"
    b = BrokerProcess(data, SHOAL_OVERRIDES)
    b.start()
    seen: dict[str, Any] = {"data": data}
    try:
        bs = b.bootstrap
        run_tool("kafka-topics", "--bootstrap-server", bs, "--create", "--topic", "dl", "--partitions", "2")
        run_tool("kafka-console-producer", "--bootstrap-server", bs, "--topic", "dl",
                 "--producer-property", "partitioner.class=org.apache.kafka.clients.producer.RoundRobinPartitioner",
                 input="".join(f"r{i}\n" for i in range(6)))
        run_tool("kafka-console-consumer", "--bootstrap-server", bs, "--topic", "dl", "--from-beginning",
                 "--max-messages", "6", "--group", "dl-classic")
        run_tool("kafka-console-consumer", "--bootstrap-server", bs, "--topic", "dl", "--from-beginning",
                 "--max-messages", "6", "--group", "dl-848", "--consumer-property", "group.protocol=consumer")
        for g in ("dl-classic", "dl-848"):
            rows = run_tool("kafka-consumer-groups", "--bootstrap-server", bs, "--describe", "--group", g).stdout
            seen[g] = {int(r.split()[2]): int(r.split()[3]) for r in rows.splitlines() if r.startswith(g + " ")}
        # a share group whose record 3 is released until the delivery count limit archives it
        run_tool("kafka-topics", "--bootstrap-server", bs, "--create", "--topic", "dl-share")
        out = parse(java("ShareDriver").run("limit", bs, "dl-share", "dl-share-g", "produce=10", "records=10",
                                            "victim=3", "share.delivery.count.limit=3"))
        assert out.errors == [] and out.start_offsets == {0: (10, 0)}
        seen["dl-share-g"] = out
        topics = run_tool("kafka-topics", "--bootstrap-server", bs, "--describe", "--topic", "dl").stdout
        seen["topic_id"] = topics.split("TopicId: ")[1].split()[0]
        topics = run_tool("kafka-topics", "--bootstrap-server", bs, "--describe", "--topic", "dl-share").stdout
        seen["share_topic_id"] = topics.split("TopicId: ")[1].split()[0]
    finally:
        b.stop()
    return seen


def logs(data: Path, topic: str) -> list[Path]:
    return sorted(p for p in data.glob(f"{topic}-*/*.log") if p.stat().st_size > 0)


def test_consumer_offsets_every_record_decodes(workload) -> None:
    """Every record shoal wrote to __consumer_offsets is one Kafka's decoder knows: no
    ShareGroupPartitionMetadata (record type 9, which Kafka 4.1 removed; its decoder
    prints "Unknown record type 9"), the share group's record 11 carrying the metadata
    hash Kafka computes for its subscribed topic instead.
    """
    records, text = dump(logs(workload["data"], "__consumer_offsets"), "--offsets-decoder")
    assert records, text[-2000:]
    bad = [(r.offset, r.key, r.value) for r in records
           if not isinstance(r.key, dict) or not (r.value is None or isinstance(r.value, dict))]
    assert bad == []
    assert {r.type for r in records} >= {1, 2, 3, 8, 10, 11, 12, 13, 14, 15}
    # The share group: joined (epoch 1, the hash of its one topic of one partition), then
    # left (epoch 2, no subscribed topic: 0).
    topic_id = uuid.UUID(bytes=base64.urlsafe_b64decode(workload["share_topic_id"] + "=="))
    share_meta = [(r.value["data"]["epoch"], r.value["data"]["metadataHash"]) for r in records
                  if r.type == 11 and r.key["data"]["groupId"] == "dl-share-g" and r.value is not None]
    assert share_meta == [(1, metadata_hash(["dl-share"], {"dl-share": (topic_id, 1)})), (2, 0)]
    assert share_meta[0][1] != 0


def test_consumer_offsets_values(workload) -> None:
    records, _ = dump(logs(workload["data"], "__consumer_offsets"), "--offsets-decoder")
    live: dict[str, Any] = {}
    for r in records:  # the last record of every key wins, as when the log is compacted
        if r.type is not None:
            live[json.dumps(r.key, sort_keys=True)] = r.value
    by_type: dict[int, list[tuple[dict, Any]]] = {}
    for k, v in live.items():
        key = json.loads(k)
        by_type.setdefault(int(key["type"]), []).append((key["data"], v))

    # offset commits (type 1): what kafka-consumer-groups reported before the broker stopped
    for g in ("dl-classic", "dl-848"):
        committed = {k["partition"]: v["data"]["offset"] for k, v in by_type[1] if k["group"] == g and v}
        assert committed == workload[g], g
        assert sum(committed.values()) == 6
    # the classic group (type 2): empty after the console consumer left, protocol type consumer
    classic = [v for k, v in by_type[2] if k["group"] == "dl-classic"]
    assert len(classic) == 1 and classic[0]["data"]["protocolType"] == "consumer"
    assert classic[0]["data"]["members"] == [] and classic[0]["data"]["generation"] >= 1
    # the KIP-848 group (types 3, 6): its epochs; the member left, so member records are tombstones
    assert [v["data"]["epoch"] for k, v in by_type[3] if k["groupId"] == "dl-848"] == [2]
    assert [v["data"]["assignmentEpoch"] for k, v in by_type[6] if k["groupId"] == "dl-848"] == [2]
    for t in (5, 7, 8):
        assert all(v is None for k, v in by_type.get(t, []) if k["groupId"] == "dl-848"), t
    # the share group (types 11, 12, 15): its epoch and initialized share-partitions
    assert [v["data"]["epoch"] for k, v in by_type[11] if k["groupId"] == "dl-share-g"] == [2]
    [spm] = [v["data"] for k, v in by_type[15] if k["groupId"] == "dl-share-g"]
    assert spm["initializedTopics"] == [
        {"topicId": workload["share_topic_id"], "topicName": "dl-share", "partitions": [0]}]
    assert spm["initializingTopics"] == [] and spm["deletingTopics"] == []


def test_consumer_offsets_member_records_while_stable(workload) -> None:
    """The member records of a stable member (ConsumerGroupCurrentMemberAssignment, type 8,
    and ShareGroupCurrentMemberAssignment, type 14) decode to Kafka's MemberState STABLE (0).

    Fails while shoal writes 2 for a stable member (Kafka reads 2 as UNRELEASED_PARTITIONS).
    """
    records, _ = dump(logs(workload["data"], "__consumer_offsets"), "--offsets-decoder")
    written = {}
    for r in records:
        if r.type in (8, 14) and r.value is not None:
            written[(r.type, r.key["data"]["groupId"])] = r.value["data"]
    assert set(written) >= {(8, "dl-848"), (14, "dl-share-g")}
    for (t, group), v in written.items():
        assert v["memberEpoch"] >= 1 and v["assignedPartitions"], (t, group, v)
        assert v["state"] == MEMBER_STATE_STABLE, (t, group, v)
    # KIP-1251: the consumer group's member record says at which epoch each partition was
    # assigned (one epoch per partition, none newer than the member's).
    v = written[(8, "dl-848")]
    for tp in v["assignedPartitions"]:
        assert len(tp["assignmentEpochs"]) == len(tp["partitions"]), v
        assert all(1 <= e <= v["memberEpoch"] for e in tp["assignmentEpochs"]), v


def test_share_group_state_records(workload) -> None:
    records, text = dump(logs(workload["data"], "__share_group_state"), "--share-group-state-decoder")
    assert records, text[-2000:]
    bad = [(r.offset, r.key, r.value) for r in records if not isinstance(r.key, dict) or not isinstance(r.value, dict)]
    assert bad == []
    mine = [r for r in records if r.key["data"]["groupId"] == "dl-share-g"]
    assert {r.type for r in mine} <= {0, 1} and mine[0].type == 0  # a ShareSnapshot first, then ShareUpdates
    assert all(r.key["data"]["topicId"] == workload["share_topic_id"] and r.key["data"]["partition"] == 0 for r in mine)
    # the last state: everything accepted or archived, the start offset past the 10 records
    assert mine[-1].value["data"]["startOffset"] == 10
    # the released record 3 was written back as available with its delivery count on the way
    counts = {b["deliveryCount"] for r in mine for b in r.value["data"]["stateBatches"]
              if b["firstOffset"] <= 3 <= b["lastOffset"] and b["deliveryState"] == 0}
    assert counts and counts <= {1, 2}, [r.value for r in mine]
    # the delivery count the client saw for record 3: 1, 2, 3 (then archived)
    out = workload["dl-share-g"]
    assert [d.delivery_count for d in out.deliveries if d.value == "3"] == [1, 2, 3]
