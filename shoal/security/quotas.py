"""Client quotas as Kafka has them: entities, validation, precedence and throttle times (pure).

Nothing here reads a clock or does I/O: every measure takes ``now_ms``. The store
(``quota_store.py``) and the connection (``server/connection.py``) are the shell.

Entities
--------
A quota entity is a user, a client id, or a user with a client id; either name may be
the default (``None`` here, ``<default>`` in Kafka's tools). An :data:`Entity` is its
components sorted by type: ``(("client-id", "app"), ("user", None))`` is the default
user's quota for client id ``app``. Each entity holds values for the keys of
:data:`QUOTA_KEYS`. IP entities (``connection_creation_rate``) are not served.

Precedence
----------
As Kafka's ClientQuotaManager: for each key on its own, the first of these entities that
sets it applies to a request of ``user`` with ``client id``::

    1 user=user, client-id=client       5 user=<default>, client-id=<default>
    2 user=user, client-id=<default>    6 user=<default>
    3 user=user                         7 client-id=client
    4 user=<default>, client-id=client  8 client-id=<default>

Requests that resolve to the same entity share its measure, named as Kafka tags its
quota metrics: where the entity names a default, the actual user or client id; where it
leaves a type out, the empty string. So a quota on ``user=alice`` is shared by every
client of alice's, and a default client-id quota is measured per client id.

Measure
-------
:class:`Rate` is Kafka's sampled rate: ``quota.window.num`` samples (11) of
``quota.window.size.seconds`` (1 s) each; a sample is complete once its window has
passed, samples older than all the windows together are forgotten, and the rate is the
sum of the samples over the time they cover, counted as at least ``num - 1`` whole
windows. A value is recorded, then checked: if the rate is above the quota, the throttle
time is ``(rate - quota) / quota * window`` milliseconds (Kafka's QuotaUtils.throttleTime),
the time after which the rate is back within the quota if nothing more comes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "CLIENT_ID",
    "CONSUMER_BYTE_RATE",
    "CONTROLLER_MUTATION_RATE",
    "IP",
    "PRODUCER_BYTE_RATE",
    "QUOTA_KEYS",
    "REQUEST_PERCENTAGE",
    "USER",
    "Entity",
    "QuotaManager",
    "QuotaRequestError",
    "Rate",
    "describe",
    "entity_of",
    "entity_text",
    "resolve",
    "validate_alteration",
]

USER, CLIENT_ID, IP = "user", "client-id", "ip"
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
QUOTA_KEYS = {PRODUCER_BYTE_RATE: "long", CONSUMER_BYTE_RATE: "long", REQUEST_PERCENTAGE: "double",
              CONTROLLER_MUTATION_RATE: "double"}
"""The keys of user and client-id entities, with their types in Kafka's QuotaConfig."""
_LONG_MAX = 2**63 - 1

Entity = tuple[tuple[str, "str | None"], ...]
"""An entity's (type, name) components sorted by type; a name of None is the default."""

MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2


class QuotaRequestError(ValueError):
    """A request Kafka refuses: ``code`` is the name of the ErrorCode to answer with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def entity_text(entity: Entity) -> str:
    """``user=alice, client-id=<default>`` (for logs and messages)."""
    return ", ".join(f"{t}={'<default>' if n is None else n}" for t, n in sorted(entity, key=lambda c: c[0] != USER))


def entity_of(components: Iterable[tuple[str, str | None]]) -> Entity:
    """The entity of an AlterClientQuotas entry, checked as Kafka's ClientQuotaControlManager does."""
    seen: dict[str, str | None] = {}
    for etype, name in components:
        if etype in seen:
            raise QuotaRequestError("invalid_request", f"Invalid empty client quota entity, duplicate entity entry "
                                                       f"{etype}")
        if etype == IP:
            raise QuotaRequestError("invalid_request", "IP quotas (connection_creation_rate) are not supported")
        if etype not in (USER, CLIENT_ID):
            raise QuotaRequestError("invalid_request", f"Unhandled client quota entity type: {etype}")
        if name is not None and name == "":
            raise QuotaRequestError("invalid_request", f"Empty {etype} not supported")
        seen[etype] = name
    if not seen:
        raise QuotaRequestError("invalid_request", "Invalid empty client quota entity")
    return tuple(sorted(seen.items()))


def validate_alteration(ops: Iterable[tuple[str, float, bool]]) -> dict[str, float | None]:
    """The changes of one entity's ops ((key, value, remove) each): key -> new value, or None
    to remove it. Raises QuotaRequestError for what Kafka refuses."""
    out: dict[str, float | None] = {}
    for key, value, remove in ops:
        kind = QUOTA_KEYS.get(key)
        if kind is None:
            raise QuotaRequestError("invalid_request", f"Invalid configuration key {key}")
        if key in out:
            raise QuotaRequestError("invalid_request", f"Duplicate quota key {key} not updating quota for entity")
        if remove:
            out[key] = None
            continue
        value = float(value)
        if math.isnan(value) or value <= 0.0:
            raise QuotaRequestError("invalid_request", f"Quota {key} must be greater than 0")
        if kind == "long":
            if value > _LONG_MAX:
                raise QuotaRequestError("invalid_request", f"Proposed value for {key} is too large for a LONG")
            if value != math.floor(value):
                raise QuotaRequestError("invalid_request", f"{key} cannot be a fractional value")
        elif math.isinf(value):
            raise QuotaRequestError("invalid_request", f"Quota {key} must be finite")
        out[key] = value
    return out


def apply_alteration(quotas: Mapping[Entity, Mapping[str, float]], entity: Entity,
                     changes: Mapping[str, float | None]) -> dict[str, float]:
    """The entity's values after ``changes`` (empty: the entity is gone)."""
    values = dict(quotas.get(entity, {}))
    for key, value in changes.items():
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value
    return values


def describe(quotas: Mapping[Entity, Mapping[str, float]], components: Iterable[tuple[str, int, str | None]],
             strict: bool) -> list[tuple[Entity, dict[str, float]]]:
    """The entities a DescribeClientQuotas filter matches, as Kafka's ClientQuotasImage does:
    ``components`` are (entity type, match type, match). Raises QuotaRequestError."""
    exact: dict[str, str | None] = {}
    typed: set[str] = set()
    for etype, match_type, match in components:
        if not etype:
            raise QuotaRequestError("invalid_request", "Invalid empty entity type.")
        if etype in exact or etype in typed:
            raise QuotaRequestError("invalid_request", f"Entity type {etype} cannot appear more than once in the "
                                                       f"filter.")
        if etype not in (USER, CLIENT_ID, IP):
            raise QuotaRequestError("unsupported_version", f"Unsupported entity type {etype}")
        if match_type == MATCH_EXACT:
            if match is None:
                raise QuotaRequestError("invalid_request", "Request specified MATCH_TYPE_EXACT, but set match string "
                                                           "to null.")
            exact[etype] = match
        elif match_type == MATCH_DEFAULT:
            if match is not None:
                raise QuotaRequestError("invalid_request", "Request specified MATCH_TYPE_DEFAULT, but also specified "
                                                           "a match string.")
            exact[etype] = None
        elif match_type == MATCH_SPECIFIED:
            if match is not None:
                raise QuotaRequestError("invalid_request", "Request specified MATCH_TYPE_SPECIFIED, but also "
                                                           "specified a match string.")
            typed.add(etype)
        else:
            raise QuotaRequestError("unsupported_version", f"Unknown match type {match_type}")
    if (IP in exact or IP in typed) and (exact.keys() | typed) - {IP}:
        raise QuotaRequestError("invalid_request", "Invalid entity filter component combination. IP filter component "
                                                   "should not be used with user or clientId filter component.")
    out = []
    for entity, values in sorted(quotas.items(), key=lambda kv: [(t, n is not None, n or "") for t, n in kv[0]]):
        names = dict(entity)
        if strict and len(names) != len(exact) + len(typed):
            continue
        if any(t not in names or names[t] != n for t, n in exact.items()):
            continue
        if any(t not in names for t in typed):
            continue
        if values:
            out.append((entity, dict(values)))
    return out


def _levels(user: str, client_id: str) -> list[tuple[Entity, tuple[str, str]]]:
    u, c, d = user, client_id, None
    both = (user, client_id)
    return [
        (((CLIENT_ID, c), (USER, u)), both),
        (((CLIENT_ID, d), (USER, u)), both),
        (((USER, u),), (user, "")),
        (((CLIENT_ID, c), (USER, d)), both),
        (((CLIENT_ID, d), (USER, d)), both),
        (((USER, d),), (user, "")),
        (((CLIENT_ID, c),), ("", client_id)),
        (((CLIENT_ID, d),), ("", client_id)),
    ]


def resolve(quotas: Mapping[Entity, Mapping[str, float]], user: str, client_id: str,
            key: str) -> tuple[float, tuple[str, str]] | None:
    """The quota on ``key`` for a request of ``user`` (the principal's name) with
    ``client_id``, and the (user, client id) its measure is shared under; None: no quota."""
    for entity, tags in _levels(user, client_id):
        values = quotas.get(entity)
        if values is not None and key in values:
            return values[key], tags
    return None


@dataclass(slots=True)
class _Sample:
    start_ms: int
    value: float = 0.0


@dataclass(slots=True)
class Rate:
    """Kafka's sampled rate (SampledStat with Rate's window size), in units per second."""

    samples: int = 11
    window_ms: int = 1000
    _samples: list[_Sample] = field(default_factory=list)
    _current: int = 0
    last_ms: int = 0

    def record(self, value: float, now_ms: int) -> None:
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        sample = self._samples[self._current]
        if now_ms - sample.start_ms >= self.window_ms:
            self._current = (self._current + 1) % self.samples
            if self._current >= len(self._samples):
                self._samples.append(_Sample(now_ms))
            else:
                self._samples[self._current] = _Sample(now_ms)
            sample = self._samples[self._current]
        sample.value += value
        self.last_ms = now_ms

    def _purge(self, now_ms: int) -> None:
        expire = self.samples * self.window_ms
        for s in self._samples:
            if now_ms - s.start_ms >= expire:
                s.start_ms, s.value = now_ms, 0.0

    def window_size_ms(self, now_ms: int) -> int:
        """The time the rate is taken over (Kafka's Rate.windowSize)."""
        self._purge(now_ms)
        oldest = min((s.start_ms for s in self._samples), default=now_ms)
        elapsed = now_ms - oldest
        full = elapsed // self.window_ms
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return max(elapsed, 1)

    def total(self, now_ms: int) -> float:
        self._purge(now_ms)
        return sum(s.value for s in self._samples)

    def rate(self, now_ms: int) -> float:
        size = self.window_size_ms(now_ms)
        return sum(s.value for s in self._samples) / (size / 1000.0)


class QuotaManager:
    """The measures of one broker: ``record`` a request's bytes (or handler time) under the
    quota that applies and get the throttle time in ms (0 within the quota).

    ``quotas`` is replaced whole when the stored quotas change (``update``); ``version``
    then moves, so that callers may cache ``limits``.
    """

    IDLE_MS = 3_600_000
    """A measure unused this long is dropped (Kafka expires quota sensors after an hour)."""

    def __init__(self, samples: int = 11, window_ms: int = 1000) -> None:
        self.samples = samples
        self.window_ms = window_ms
        self.quotas: dict[Entity, dict[str, float]] = {}
        self.version = 0
        self._rates: dict[tuple[str, str, str], Rate] = {}
        self._swept_ms = 0

    @property
    def active(self) -> bool:
        return bool(self.quotas)

    def update(self, quotas: Mapping[Entity, Mapping[str, float]]) -> None:
        new = {e: dict(v) for e, v in quotas.items() if v}
        if new != self.quotas:
            self.quotas = new
            self.version += 1

    def limits(self, user: str, client_id: str) -> dict[str, tuple[float, tuple[str, str]]]:
        """key -> (quota, measure tags) of every key with a quota for this user and client id."""
        out = {}
        for key in (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE):
            got = resolve(self.quotas, user, client_id, key)
            if got is not None:
                out[key] = got
        return out

    def max_in_window(self, limit: float) -> float:
        """The most a single measure may take at once (Kafka's getMaxValueInQuotaWindow):
        the quota over ``samples - 1`` windows."""
        return limit * (self.samples - 1) * self.window_ms / 1000.0

    def _rate(self, key: str, tags: tuple[str, str], now_ms: int) -> Rate:
        name = (key, *tags)
        rate = self._rates.get(name)
        if rate is None:
            if now_ms - self._swept_ms >= 60_000:
                self._swept_ms = now_ms
                for k in [k for k, r in self._rates.items() if now_ms - r.last_ms >= self.IDLE_MS]:
                    del self._rates[k]
            rate = self._rates[name] = Rate(self.samples, self.window_ms, last_ms=now_ms)
        return rate

    def record(self, key: str, limit: float, tags: tuple[str, str], value: float, now_ms: int) -> int:
        """Record ``value`` and return the throttle time in ms (0: within the quota)."""
        rate = self._rate(key, tags, now_ms)
        rate.record(value, now_ms)
        measured = rate.rate(now_ms)
        if measured <= limit:
            return 0
        return round((measured - limit) / limit * rate.window_size_ms(now_ms))

    def unrecord(self, key: str, tags: tuple[str, str], value: float, now_ms: int) -> None:
        """Take back a recorded value (a throttled Fetch answered empty, as Kafka does)."""
        rate = self._rates.get((key, *tags))
        if rate is not None:
            rate.record(-value, now_ms)

    def measured(self, key: str, tags: tuple[str, str], now_ms: int) -> float:
        rate = self._rates.get((key, *tags))
        return 0.0 if rate is None else rate.rate(now_ms)
