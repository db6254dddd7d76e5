"""Reading what the Java drivers in tests/reference/java print, one line per event."""

from __future__ import annotations

import subprocess
from collections import defaultdict
from dataclasses import dataclass, field

__all__ = ["Delivery", "DriverOutput", "parse"]


@dataclass(frozen=True)
class Delivery:
    consumer: int
    partition: int
    offset: int
    value: str
    delivery_count: int
    action: str  # A accept, R release, J reject, N renew/held, I implicit


@dataclass
class DriverOutput:
    deliveries: list[Delivery] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # C (commit) and X (thread) lines
    start_offsets: dict[int, tuple[int, int]] = field(default_factory=dict)  # partition -> (start offset, lag)
    other: list[list[str]] = field(default_factory=list)
    stderr: str = ""

    def by_value(self) -> dict[str, list[Delivery]]:
        out: dict[str, list[Delivery]] = defaultdict(list)
        for d in self.deliveries:
            out[d.value].append(d)
        return out

    def lines(self, tag: str) -> list[list[str]]:
        return [w for w in self.other if w[0] == tag]


def parse(proc: subprocess.CompletedProcess[str] | str) -> DriverOutput:
    text = proc if isinstance(proc, str) else proc.stdout
    out = DriverOutput(stderr="" if isinstance(proc, str) else proc.stderr)
    for line in text.splitlines():
        w = line.split()
        if not w:
            continue
        if w[0] == "D":
            out.deliveries.append(Delivery(int(w[1]), int(w[2]), int(w[3]), w[4], int(w[5]), w[6]))
        elif w[0] in ("C", "X"):
            out.errors.append(line)
        elif w[0] == "O":
            out.start_offsets[int(w[1])] = (int(w[2]), int(w[3]))
        else:
            out.other.append(w)
    return out
