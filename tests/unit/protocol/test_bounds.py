"""The length-field check run before kio's native reader (shoal/protocol/bounds.py).

* Every request version the broker serves: random valid bodies written by kio's writer
  pass the check, which ends exactly where kio's reader ends.
* The frames that made kio's reader ask for tens of gigabytes (and abort the process)
  are refused before the reader sees them.
* Extreme lengths written over every position of valid bodies: whatever passes the check
  decodes (or fails to decode) in kio without the process dying; these run in a child
  process, so that a miss shows as a failed test instead of a dead test run.
"""

from __future__ import annotations

import datetime
import random
import struct
import subprocess
import sys

import pytest
from kio.index import load_request_schema
from kio.serial import entity_reader

from shoal.errors import ProtocolViolation
from shoal.protocol.bounds import UnknownTaggedFields, check_request
from shoal.protocol.codec import codec_for, decode_request
from shoal.protocol.fetch_request import write_fetch_request_v12
from shoal.protocol.header import uvarint
from shoal.server.dispatch import routes
from tests.support.fuzz import encode, random_entity

SERVED = [(key, v) for key, r in sorted(routes().items()) for v in range(r.min_version, r.max_version + 1)]


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_valid_bodies_pass_and_end_where_kio_ends(api_key: int, version: int) -> None:
    cls = load_request_schema(api_key, version)
    rng = random.Random(api_key * 1000 + version)
    for _ in range(30):
        body = encode(random_entity(cls, rng))
        framed = b"pre" + body + b"after"  # at an offset, with bytes after the body (ignored)
        assert check_request(cls, framed, 3) == 3 + len(body)
        _, size = entity_reader(cls)(framed, 3)
        assert size == len(body)


def test_elements_with_tagged_fields_are_stepped_over_one_by_one() -> None:
    """Fixed-width elements are checked by stride while none has tagged fields; one that has
    some is walked element by element, and a tagged field running past the frame is refused."""
    cls = load_request_schema(1, 12)
    body = write_fetch_request_v12(1, 500, 1, 1 << 20, [("t", [(0, 0, 5, 100), (1, 0, 5, 100), (2, 0, 5, 100)])])
    assert check_request(cls, body, 0) == len(body)
    second_tags = 29 + 33 + 32  # top-level fields and topic, first partition, second one's fields
    assert body[second_tags] == 0
    tagged = body[:second_tags] + b"\x01\x07\x02ab" + body[second_tags + 1:]  # tag 7, 2 bytes
    with pytest.raises(UnknownTaggedFields) as unknown:  # Fetch v12 has no tag 7 there
        check_request(cls, tagged, 0)
    assert unknown.value.frame == body
    overlong = body[:second_tags] + b"\x01\x07\x7fab" + body[second_tags + 1:]
    with pytest.raises(ProtocolViolation, match="tagged field 7"):
        check_request(cls, overlong, 0)


def test_unknown_tagged_fields_are_skipped_as_kafka_skips_them() -> None:
    """A newer client may send tagged fields this version's schema lacks: the request is
    decoded without them, the known ones kept (kio's reader alone refuses the frame)."""
    from kio.schema.fetch.v15.request import FetchPartition, FetchRequest, FetchTopic, ReplicaState

    cls = load_request_schema(1, 15)
    want = FetchRequest(max_wait=datetime.timedelta(milliseconds=500), min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
                        session_epoch=-1, rack_id="", cluster_id="c1",
                        replica_state=ReplicaState(replica_id=-1, replica_epoch=3),  # written: not the default
                        forgotten_topics_data=(), topics=(FetchTopic(topic_id=None, partitions=tuple(
                            FetchPartition(partition=p, current_leader_epoch=0, fetch_offset=5, last_fetched_epoch=-1,
                                           log_start_offset=-1, partition_max_bytes=100) for p in range(2)),),))
    body = encode(want)
    # The top level ends with its tagged fields: ClusterId (tag 0) and ReplicaState (tag 1).
    # Add unknown tags 9 (at the top, between the known ones' and after them) and 3 (in a
    # partition).
    top_count = len(body) - len(encode(want.replica_state)) - 2 - (1 + 1 + 3) - 1
    assert body[top_count] == 2
    extended = bytearray(body)
    extended[top_count] = 4
    extended += b"\x09\x03xyz" + b"\x0a\x00"
    # 21 bytes of top-level fields, the topics' count, a topic id, the partitions' count,
    # then partitions of 33 bytes each, the last one their tagged-field count.
    end_of_first = 21 + 1 + 16 + 1 + 32
    assert extended[end_of_first] == 0 and extended[end_of_first + 1:end_of_first + 5] == bytes.fromhex("00000001")
    extended[end_of_first:end_of_first + 1] = b"\x01\x03\x01q"
    with pytest.raises(UnknownTaggedFields):
        check_request(cls, bytes(extended), 0)
    hdr = header(1, 15, True)
    _, got = decode_request(hdr + bytes(extended), codec_for(1, 15))
    assert got == want
    with pytest.raises(KeyError, match="Unknown tagged field"):  # what kio alone does
        entity_reader(cls)(bytes(extended), 0)


def test_an_unknown_tagged_field_running_past_the_frame_is_still_refused() -> None:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    body = encode(ApiVersionsRequest(client_software_name="c", client_software_version="1"))
    with pytest.raises(ProtocolViolation, match="tagged field 5 of 9 bytes"):
        decode_request(header(18, 3, True) + body[:-1] + b"\x01\x05\x09ab", codec_for(18, 3))


def uv(n: int) -> bytes:
    return uvarint(n)


def header(api_key: int, version: int, flexible: bool) -> bytes:
    return struct.pack(">hhih", api_key, version, 7, -1) + (b"\x00" if flexible else b"")


# The frames of the report: each made kio's reader reserve gigabytes and abort the process.
ABORTING = {
    "metadata-v12": (3, 12, uv(2**32 - 2)),
    "fetch-v16": (1, 16, b"\x00" * 21 + uv(2**32 - 2)),
    "produce-v9": (0, 9, b"\x00" + b"\x00\x01" + b"\x00\x00\x03\xe8" + uv(2**32 - 2)),
    "produce-v3": (0, 3, struct.pack(">hhii", -1, 1, 1000, 2**31 - 1)),
    "fetch-v4-partitions": (1, 4, struct.pack(">iiiib", -1, 0, 0, 0, 0) + struct.pack(">ih", 1, 1) + b"t"
                            + struct.pack(">i", 2**31 - 1)),
}


def run_child(code: str) -> str:
    """Run ``code`` in a fresh interpreter (an abort in kio kills only that one); its stdout."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"
    return out.stdout


def test_huge_counts_are_refused_before_kio_reads_them() -> None:
    out = run_child("""
from shoal.errors import ProtocolViolation
from shoal.protocol.codec import codec_for, decode_request
from shoal.protocol.fetch_request import write_fetch_request_v12
from tests.unit.protocol.test_bounds import ABORTING, header
for name, (api_key, version, body) in sorted(ABORTING.items()):
    codec = codec_for(api_key, version)
    try:
        decode_request(header(api_key, version, codec.flexible) + body, codec)
    except ProtocolViolation as e:
        print(name, "refused:", e)
    else:
        print(name, "decoded")
""")
    assert out.count("refused:") == len(ABORTING), out


@pytest.mark.parametrize(("api_key", "version", "body", "message"), [
    (0, 3, struct.pack(">hhii", -1, 1, 1000, -1), "not nullable"),           # Produce's topics null
    (1, 16, b"\x00" * 21 + b"\x00\x01\x01\x00", "not nullable"),             # Fetch's topics null
    (0, 3, struct.pack(">hhii", -1, 1, 1000, -2), "negative array length"),
    (3, 12, b"\x00\x01\x00", "past the end"),                                # truncated
    (3, 12, b"\x01\x01\x00\x01\x05" + uv(2**31), "tagged field 5"),         # larger than the frame
    (3, 12, b"\x01\x01\x00" + uv(2**32 - 1), "tagged fields announced"),
    # a topic name of 32,768 bytes: Kafka's readers refuse strings longer than 32,767
    (3, 12, b"\x02" + b"\x00" * 16 + uv(32769) + b"a" * 32768 + b"\x00\x01\x00\x00", "longer than 32767"),
    # Fetch's cluster id (tag 0) announcing 5 bytes and holding 1: the reader would go on elsewhere
    (1, 16, b"\x00" * 21 + b"\x01\x01\x01" + b"\x01\x00\x05\x01" + b"\x00" * 4, "does not fill"),
])
def test_malformed_lengths_are_protocol_violations(api_key, version, body, message) -> None:
    codec = codec_for(api_key, version)
    assert codec is not None
    with pytest.raises(ProtocolViolation, match=message):
        decode_request(header(api_key, version, codec.flexible) + body, codec)


_PATCHES = [struct.pack(">i", 2**31 - 1), struct.pack(">i", -2), struct.pack(">h", 32767), uv(2**32 - 2),
            uv(2**31 - 1), uv(2**28), b"\xff\xff\xff\xff\xff\x01", b"\x00"]

_CHILD = """
import random, struct, sys
from kio.index import load_request_schema
from kio.serial import entity_reader
from shoal.errors import ProtocolViolation
from shoal.protocol.bounds import UnknownTaggedFields, check_request
from tests.support.fuzz import encode, random_entity
from tests.unit.protocol.test_bounds import SERVED, _PATCHES

passed = refused = 0
for api_key, version in SERVED:
    cls = load_request_schema(api_key, version)
    reader = entity_reader(cls)
    rng = random.Random(api_key * 7919 + version)
    for _ in range(2):
        body = encode(random_entity(cls, rng))
        for pos in range(min(len(body), 40)):
            for patch in _PATCHES:
                for mutated in (body[:pos] + patch + body[pos + len(patch):], body[:pos] + patch + body[pos:],
                                body[:pos]):
                    try:
                        check_request(cls, mutated, 0)
                    except ProtocolViolation:
                        refused += 1
                        continue
                    passed += 1
                    try:
                        reader(mutated, 0)
                    except Exception:
                        pass
print(passed, refused)
"""


def test_extreme_lengths_anywhere_never_reach_kio_unchecked() -> None:
    passed, refused = map(int, run_child(_CHILD).split())
    assert refused > 0 and passed > 0


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_valid_responses_pass_too(api_key: int, version: int) -> None:
    """The peer connection checks other brokers' answers with the same checker."""
    from kio.index import load_response_schema

    cls = load_response_schema(api_key, version)
    rng = random.Random(api_key * 1000 + version)
    for _ in range(5):
        body = encode(random_entity(cls, rng))
        assert check_request(cls, memoryview(body), 0) == len(body)


def test_a_peer_answer_announcing_billions_of_elements_is_a_connection_error() -> None:
    """A peer broker (or whatever listens on its port) answering Metadata v12 with a broker
    list of 2^32-2 entries: PeerConnection.call raises ConnectionError, the process lives."""
    out = run_child("""
import asyncio, struct
from kio.schema.metadata.v12 import request as metadata12
from shoal.cluster.peer import PeerConnection
from tests.support.fuzz import uv

async def answer(reader, writer):
    size, = struct.unpack(">i", await reader.readexactly(4))
    request = await reader.readexactly(size)
    cid = request[4:8]
    body = cid + b"\\x00" + b"\\x00" * 4 + uv(2**32 - 1) + b"\\x00" * 16
    writer.write(struct.pack(">i", len(body)) + body)
    await writer.drain()

async def main():
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conn = PeerConnection("127.0.0.1", port, "test")
    try:
        await conn.call(3, 12, metadata12.MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    except ConnectionError as e:
        print("refused:", e)
    finally:
        conn.close()
        server.close()

asyncio.run(main())
""")
    assert "refused:" in out and "MetadataResponse.brokers" in out, out
