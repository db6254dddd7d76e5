"""The reassignment JSON of ``shoal reassign-partitions`` (Kafka's format)."""

import json

import pytest

from shoal.cli.common import CliError
from shoal.cli.reassign_partitions import assignment_json, parse_reassignment


def test_kafka_reassignment_json_round_trips():
    doc = {"version": 1, "partitions": [{"topic": "t", "partition": 1, "replicas": [3, 1], "log_dirs": ["any", "any"]},
                                        {"topic": "t", "partition": 0, "replicas": [2]}]}
    targets = parse_reassignment(doc)
    assert targets == {("t", 1): [3, 1], ("t", 0): [2]}
    assert json.loads(assignment_json(targets)) == {"version": 1, "partitions": [
        {"topic": "t", "partition": 0, "replicas": [2], "log_dirs": ["any"]},
        {"topic": "t", "partition": 1, "replicas": [3, 1], "log_dirs": ["any", "any"]}]}


@pytest.mark.parametrize("doc, problem", [
    ({"partitions": "x"}, "must be"),
    ({"version": 2, "partitions": []}, "version"),
    ({"partitions": [{"topic": "t", "replicas": [1]}]}, "needs topic, partition and replicas"),
    ({"partitions": [{"topic": "t", "partition": 0, "replicas": []}]}, "empty replica list"),
    ({"partitions": [{"topic": "t", "partition": 0, "replicas": [1, 1]}]}, "duplicate"),
    ({"partitions": [{"topic": "t", "partition": 0, "replicas": [1]}] * 2}, "more than once"),
    ({"partitions": [{"topic": "t", "partition": 0, "replicas": [1], "log_dirs": ["/d"]}]}, "log_dirs"),
])
def test_bad_reassignment_json_is_refused(doc, problem):
    with pytest.raises(CliError, match=problem):
        parse_reassignment(doc)
