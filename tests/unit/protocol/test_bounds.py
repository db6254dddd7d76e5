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

import random
import struct
import subprocess
import sys

import pytest
from kio.index import load_request_schema
from kio.serial import entity_reader

from shoal.errors import ProtocolViolation
from shoal.protocol.bounds import check_request
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
    assert check_request(cls, tagged, 0) == len(tagged)
    overlong = body[:second_tags] + b"\x01\x07\x7fab" + body[second_tags + 1:]
    with pytest.raises(ProtocolViolation, match="tagged field 7"):
        check_request(cls, overlong, 0)


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
from shoal.protocol.bounds import check_request
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
