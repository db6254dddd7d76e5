"""Fuzzing every API version the broker serves, on raw sockets against a real broker.

For each (API, version) of the broker's ApiVersions answer: random valid requests built
from kio's schema, then the same bodies with every length field (array and string
lengths, compact lengths, tagged-field counts and sizes) set to extreme values (2^31-1,
2^32-2, -2, null, overlong varints), uuids garbled, strings made invalid UTF-8, the body
truncated, and the request header's client id and tagged fields mangled. After each case
the broker must have answered with a response that decodes as that API version's response
(correlation id included) or closed the connection; a valid request must be answered.
At the end the broker is alive, still serves a producer and a consumer, and its stderr
holds no traceback: nothing was an unhandled exception.
"""

from __future__ import annotations

import dataclasses
import datetime
import random
import socket
import struct
import time
from collections.abc import Iterator
from typing import NamedTuple

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.serial import entity_reader

from tests.support.clients import create_topic
from tests.support.fuzz import encode, mutations, random_entity, uv
from tests.support.wire import RawConnection, frame

from .test_bad_input import still_serves

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

TOPIC = "fuzz"
NAMES = (TOPIC, "fuzz-group", "fuzz-share", "member-1", "__consumer_offsets")
ANSWER_TIMEOUT_S = 15.0
ROUNDS = 2
"""Random valid requests per API version; the even ones also mutated, the odd ones with
some strings of 32,767 characters."""
PER_SPOT = 1
"""Extreme values written at each length field, uuid or string of a request."""


def request_frame(api_key: int, version: int, flexible: bool, correlation_id: int, body: bytes,
                  client_id: bytes | None = b"fuzz") -> bytes:
    header = struct.pack(">hhi", api_key, version, correlation_id)
    header += struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    if flexible:
        header += b"\x00"
    return frame(header + body)


DESCRIBE_TRANSACTIONS = 65


class Prober:
    """One connection at a time; a new one after the broker closed the last."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.conn: RawConnection | None = None
        self.answered = self.closed = 0

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def probe(self, data: bytes, api_key: int, version: int, correlation_id: int, what: str) -> bool:
        """Send framed requests; True if the answer to the last (``api_key``, ``version``,
        ``correlation_id``) came (and decodes), False if the connection was closed."""
        if self.conn is None:
            self.conn = RawConnection(self.bootstrap, timeout_s=ANSWER_TIMEOUT_S)
        conn = self.conn
        try:
            conn.send(data)
            body = conn.read_frame()
        except (ConnectionResetError, BrokenPipeError):
            body = None
        except socket.timeout:
            raise AssertionError(f"{what}: neither answered nor closed in {ANSWER_TIMEOUT_S} s") from None
        if body is None:
            self.close()
            self.closed += 1
            return False
        (got,) = struct.unpack_from(">i", body, 0)
        assert got == correlation_id, f"{what}: correlation id {got}, sent {correlation_id}"
        cls = load_response_schema(api_key, version)
        pos = 4
        if cls.__flexible__ and api_key != 18:
            assert body[pos] == 0, f"{what}: response header with tagged fields"
            pos += 1
        try:
            _, used = entity_reader(cls)(body, pos)
        except Exception as e:
            if api_key == DESCRIBE_TRANSACTIONS and "negative timestamp" in str(e):
                # Kafka's -1 for "no transaction started yet" (a transactional id just
                # initialized), which kio's datetime reader does not take
                return True
            raise AssertionError(f"{what}: the answer does not decode as {cls.__name__} v{version}: {e}") from e
        assert pos + used == len(body), f"{what}: {len(body) - pos - used} bytes after the answer"
        self.answered += 1
        return True


def served_versions(bootstrap: str) -> list[tuple[int, int]]:
    with RawConnection(bootstrap) as conn:
        answer = conn.request(ApiVersionsRequest(client_software_name="fuzz", client_software_version="1"))
    return [(k.api_key, v) for k in answer.api_keys for v in range(k.min_version, k.max_version + 1)]


class Case(NamedTuple):
    what: str
    data: bytes
    """Framed requests; the answer looked for is the last one's."""
    correlation_id: int
    api_key: int
    version: int
    must_answer: bool


def cases(api_key: int, version: int, rng: random.Random) -> Iterator[Case]:
    """The cases for one API version."""
    cls = load_request_schema(api_key, version)
    flexible = bool(cls.__flexible__)
    cid = api_key * 100_000 + version * 1000
    for round_ in range(ROUNDS):
        entity = random_entity(cls, rng, names=NAMES, long_strings=round_ % 2 == 1)
        name = f"{cls.__name__} v{version}"
        if api_key == 0 and entity.acks == 0:
            # No answer to acks=0 Produce (a refused one closes the connection): an
            # ApiVersions request after it must be answered, unless the connection closed.
            cid += 1
            yield Case(f"{name} acks=0 #{round_}", request_frame(api_key, version, flexible, cid, encode(entity))
                       + request_frame(18, 0, False, cid + 1, b""), cid + 1, 18, 0, False)
            cid += 1
            entity = dataclasses.replace(entity, acks=rng.choice((-1, 1, 3)))
        body = encode(entity)
        cid += 1
        yield Case(f"{name} valid #{round_}", request_frame(api_key, version, flexible, cid, body), cid,
                   api_key, version, True)
        if round_ % 2:
            continue  # the long strings' round is sent as it is
        for what, mutated in mutations(cls, body, rng, PER_SPOT):
            cid += 1
            yield Case(f"{name} {what}", request_frame(api_key, version, flexible, cid, mutated), cid,
                       api_key, version, False)
    body = encode(random_entity(cls, rng, names=NAMES))
    cid += 1
    head = struct.pack(">hhi", api_key, version, cid)
    name = f"{cls.__name__} v{version}"
    bad_headers = [("client id length 32767", struct.pack(">h", 32767) + b"ab"),
                   ("client id length -2", struct.pack(">h", -2))]
    if flexible:
        bad_headers += [("header tagged fields 2^32-1", struct.pack(">h", -1) + uv(2**32 - 1)),
                        ("header tagged field of 2^31 bytes", struct.pack(">h", -1) + b"\x01\x00" + uv(2**31))]
    for what, header_rest in bad_headers:
        yield Case(f"{name}: {what}", frame(head + header_rest + body), cid, api_key, version, False)


def test_every_api_version_survives_extreme_lengths(start_broker) -> None:
    b = start_broker({"group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "1"})
    create_topic(b.bootstrap, TOPIC, 2)
    versions = served_versions(b.bootstrap)
    assert len(versions) > 150
    rng = random.Random(20261127)
    prober = Prober(b.bootstrap)
    unanswered: list[str] = []
    started = time.monotonic()
    n = 0
    try:
        for api_key, version in versions:
            for case in cases(api_key, version, rng):
                n += 1
                if not prober.probe(case.data, case.api_key, case.version, case.correlation_id, case.what) \
                        and case.must_answer:
                    unanswered.append(case.what)
                if not b.is_alive():
                    raise AssertionError(f"the broker died on {case.what}\n{b.stderr_tail(30)}")
    finally:
        prober.close()
    elapsed = time.monotonic() - started
    print(f"{n} cases in {elapsed:.1f} s: {prober.answered} answered, {prober.closed} closed")
    assert not unanswered, f"valid requests not answered: {unanswered}\n{b.stderr_tail(40)}"
    still_serves(b, TOPIC)
    log = b.stderr_path.read_text(errors="replace")
    tracebacks = [block for block in log.split("Traceback (most recent call last)")[1:]]
    assert not tracebacks, f"{len(tracebacks)} unhandled exceptions; the first:\n{tracebacks[0][:3000]}"


def test_the_longest_group_instance_ids_join_and_the_group_goes_on(start_broker, topic_name) -> None:
    """A JoinGroup with a 32,767-character group.instance.id (the most a request string holds)
    is answered with a member id every response version can carry; the member syncs, and
    a consumer joining the group afterwards consumes."""
    from kio.schema.describe_groups.v4 import request as describe4
    from kio.schema.join_group.v5 import request as join5
    from kio.schema.join_group.v9 import request as join9
    from kio.schema.sync_group.v3 import request as sync3

    from tests.support.clients import consume_exact, consumer, produce_all, producer

    b = start_broker({"group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "1000"})
    create_topic(b.bootstrap, topic_name, 1)
    group = "long-instance-ids"

    def join(module, instance_id: str, group: str = group):
        return module.JoinGroupRequest(
            group_id=group, session_timeout=datetime.timedelta(seconds=2),
            rebalance_timeout=datetime.timedelta(seconds=2), member_id="", group_instance_id=instance_id,
            protocol_type="consumer", protocols=(module.JoinGroupRequestProtocol(name="range", metadata=b""),),
            **({"reason": None} if module is join9 else {}))

    longest = "i" * 32767
    with RawConnection(b.bootstrap, timeout_s=20) as conn:
        joined = conn.request(join(join5, longest))
        assert joined.error_code == 0, joined.error_code
        assert joined.member_id.startswith("i" * 1000)
        assert len(joined.member_id.encode()) <= 32767
        synced = conn.request(sync3.SyncGroupRequest(
            group_id=group, generation_id=joined.generation_id, member_id=joined.member_id,
            group_instance_id=longest, assignments=(sync3.SyncGroupRequestAssignment(
                member_id=joined.member_id, assignment=b""),)))
        assert synced.error_code == 0, synced.error_code
        described = conn.request(describe4.DescribeGroupsRequest(groups=(group,), include_authorized_operations=False))
        (member,) = described.groups[0].members
        assert (member.member_id, member.group_instance_id) == (joined.member_id, longest)

    # two-byte characters: 32,766 bytes of instance id (a flexible request), cut to a whole character
    wide = "é" * 16383
    with RawConnection(b.bootstrap, timeout_s=20) as conn:
        joined = conn.request(join(join9, wide, group + "-wide"))
        assert joined.error_code == 0, joined.error_code
        assert joined.member_id.startswith("é" * 1000) and len(joined.member_id.encode()) <= 32767

    produce_all(producer(b.bootstrap), topic_name, [{"value": b"after-%d" % i} for i in range(5)])
    c = consumer(b.bootstrap, **{"group.id": group, "session.timeout.ms": 6000})
    try:
        c.subscribe([topic_name])
        got = consume_exact(c, 5, timeout_s=60)
    finally:
        c.close()
    assert sorted(r.value for r in got) == [b"after-%d" % i for i in range(5)]
    b.assert_alive()


def test_requests_for_billions_of_partitions_are_refused_as_kafka_refuses_them(start_broker, topic_name) -> None:
    """CreateTopics and CreatePartitions asking for 2^31-1 partitions: POLICY_VIOLATION (Kafka's
    limit of 10,000 records per operation), at once; the broker goes on serving."""
    from kio.schema.create_partitions.v3 import request as cp3
    from kio.schema.create_topics.v7 import request as ct7

    b = start_broker()
    create_topic(b.bootstrap, topic_name, 1)
    with RawConnection(b.bootstrap, timeout_s=20) as conn:
        created = conn.request(ct7.CreateTopicsRequest(topics=(ct7.CreatableTopic(
            name=topic_name + "-huge", num_partitions=2**31 - 1, replication_factor=-1, assignments=(),
            configs=()),), timeout=datetime.timedelta(seconds=5), validate_only=False))
        assert [(t.name, t.error_code) for t in created.topics] == [(topic_name + "-huge", ErrorCode.policy_violation)]
        grown = conn.request(cp3.CreatePartitionsRequest(topics=(cp3.CreatePartitionsTopic(
            name=topic_name, count=2**31 - 1, assignments=None),), timeout=datetime.timedelta(seconds=5),
            validate_only=False))
        assert [(t.name, t.error_code) for t in grown.results] == [(topic_name, ErrorCode.policy_violation)]
        # below the limit is fine
        grown = conn.request(cp3.CreatePartitionsRequest(topics=(cp3.CreatePartitionsTopic(
            name=topic_name, count=3, assignments=None),), timeout=datetime.timedelta(seconds=5),
            validate_only=True))
        assert [(t.name, t.error_code) for t in grown.results] == [(topic_name, ErrorCode.none)]
    still_serves(b, topic_name)
