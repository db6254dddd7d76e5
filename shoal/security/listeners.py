"""Kafka's listener settings, parsed (pure).

* ``listeners``: ``NAME://host:port`` entries, comma separated. ``NAME`` is a listener
  name; its security protocol is ``listener.security.protocol.map``'s entry for it
  (by default each of PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL maps to itself). An
  empty host listens on every interface. ``shoal serve --host/--port`` replace the
  first listener's host and port.
* ``advertised.listeners``: what Metadata, FindCoordinator and DescribeCluster tell a
  client for the listener its request came in on; a listener not named there
  advertises the address it is bound to. A bare ``host:port`` (no name) is taken for the
  first listener.
* ``inter.broker.listener.name``: the listener brokers of a cluster use to reach each
  other (empty: the one named PLAINTEXT if any, else the first).
* ``listener.name.<listener>.<key>``: a per-listener value of an ``ssl.*`` or ``sasl.*``
  key (the listener name in lower case, as Kafka writes it), e.g.
  ``listener.name.sasl_ssl.plain.sasl.jaas.config``; :func:`listener_value` looks a key
  up there first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PROTOCOLS",
    "ListenerError",
    "ListenerSpec",
    "advertised_endpoints",
    "inter_broker_listener",
    "listener_specs",
    "listener_value",
    "parse_listener_list",
    "parse_protocol_map",
]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
PREFIX = "listener.name."


class ListenerError(ValueError):
    """A listener setting that does not parse or does not fit with the others."""


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    name: str
    protocol: str
    host: str
    port: int

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def secured(self) -> bool:
        return self.protocol != "PLAINTEXT"


def parse_protocol_map(text: str) -> dict[str, str]:
    """``NAME:PROTOCOL`` pairs -> {NAME: PROTOCOL}. Raises ListenerError."""
    out: dict[str, str] = {}
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, protocol = entry.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name or protocol not in PROTOCOLS:
            raise ListenerError(f"listener.security.protocol.map: {entry!r} is not NAME:PROTOCOL "
                                f"with PROTOCOL one of {', '.join(PROTOCOLS)}")
        out[name] = protocol
    return out


def parse_listener_list(text: str, key: str) -> list[tuple[str | None, str, int]]:
    """``NAME://host:port`` entries -> [(NAME, host, port)]; a bare ``host:port`` gives NAME None.

    IPv6 hosts are written in brackets. Raises ListenerError."""
    out: list[tuple[str | None, str, int]] = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        name: str | None
        if "://" in entry:
            name, _, hostport = entry.partition("://")
            name = name.strip().upper()
            if not name:
                raise ListenerError(f"{key}: {entry!r} has no listener name")
        else:
            name, hostport = None, entry
        host, sep, port = hostport.rpartition(":")
        if not sep or not port.strip().isdigit() or int(port) > 65535:
            raise ListenerError(f"{key}: {entry!r} is not NAME://host:port")
        host = host.strip()
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        out.append((name, host, int(port)))
    return out


def listener_specs(config: Mapping[str, Any], host: str | None = None, port: int | None = None) -> list[ListenerSpec]:
    """The broker's listeners, the first with ``host``/``port`` applied when given.

    Raises ListenerError for a malformed list, a name without a protocol, a name or a
    port used twice."""
    protocols = parse_protocol_map(config["listener.security.protocol.map"])
    entries = parse_listener_list(config["listeners"], "listeners")
    if not entries:
        raise ListenerError("listeners: no listener given")
    specs: list[ListenerSpec] = []
    for i, (name, h, p) in enumerate(entries):
        if name is None:
            name = "PLAINTEXT"
        if name not in protocols:
            raise ListenerError(f"listeners: listener {name} has no security protocol: add {name}:PROTOCOL "
                                "to listener.security.protocol.map")
        if i == 0:
            h = host if host is not None else h
            p = port if port is not None else p
        specs.append(ListenerSpec(name, protocols[name], h, p))
    names = [s.name for s in specs]
    for n in names:
        if names.count(n) > 1:
            raise ListenerError(f"listeners: listener {n} is named twice")
    ports = [s.port for s in specs if s.port != 0]
    for q in ports:
        if ports.count(q) > 1:
            raise ListenerError(f"listeners: port {q} is used by two listeners")
    return specs


def advertised_endpoints(config: Mapping[str, Any], specs: list[ListenerSpec],
                         bound: Mapping[str, tuple[str, int]]) -> dict[str, tuple[str, int]]:
    """{listener name: (host, port)} to give clients; ``bound`` holds each listener's bound address."""
    out = dict(bound)
    names = {s.name for s in specs}
    for name, h, p in parse_listener_list(config["advertised.listeners"], "advertised.listeners"):
        if name is None:
            name = specs[0].name
        if name not in names:
            raise ListenerError(f"advertised.listeners: {name} is not one of the listeners "
                                f"({', '.join(sorted(names))})")
        out[name] = (h or bound[name][0], p)
    return out


def inter_broker_listener(config: Mapping[str, Any], specs: list[ListenerSpec]) -> ListenerSpec:
    """The listener other brokers reach this one on. Raises ListenerError for an unknown name."""
    name = str(config["inter.broker.listener.name"]).strip().upper()
    if not name:
        return next((s for s in specs if s.name == "PLAINTEXT"), specs[0])
    for s in specs:
        if s.name == name:
            return s
    raise ListenerError(f"inter.broker.listener.name: {name} is not one of the listeners "
                        f"({', '.join(s.name for s in specs)})")


def listener_value(config: Any, listener: str, key: str) -> Any:
    """``listener.name.<listener>.<key>`` if set, else the broker's ``key``."""
    overrides: Mapping[str, str] = getattr(config, "listener_overrides", {})
    value = overrides.get(f"{PREFIX}{listener.lower()}.{key}")
    if value is not None:
        return value
    try:
        return config[key]
    except KeyError:
        return None
