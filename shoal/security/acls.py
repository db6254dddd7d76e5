"""ACLs and the authorization decision, as Kafka's StandardAuthorizer makes it (pure).

An :class:`AclBinding` is Kafka's: a resource pattern (type, name, LITERAL or PREFIXED),
a principal (``User:alice``, or ``User:*`` for everyone), a host (an IP address, or ``*``),
an operation and ALLOW or DENY. The numbers are Kafka's wire codes.

:class:`Authorizer` holds one set of bindings and answers "may this principal, from this
host, do this operation on this resource": ``super.users`` may do everything; otherwise
the bindings whose pattern matches the resource are those of the literal name, the
literal ``*`` and every PREFIXED name the resource's name starts with. A matching DENY
(operation the one asked or ALL) wins over any ALLOW. An ALLOW of the operation, of ALL,
or one that implies it (READ, WRITE, DELETE or ALTER imply DESCRIBE; ALTER_CONFIGS implies
DESCRIBE_CONFIGS) allows. A resource no binding matches at all is allowed only with
``allow.everyone.if.no.acl.found``. Answers are cached per principal, host, operation and
resource: a new set of bindings is a new Authorizer.

:class:`AclFilter` is the filter of DescribeAcls and DeleteAcls, with Kafka's matching
(ANY matches every value; a MATCH pattern filter matches the bindings that would apply
to the named resource).
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Iterable
from typing import NamedTuple

__all__ = [
    "CLUSTER_NAME",
    "WILDCARD",
    "AclBinding",
    "AclError",
    "AclFilter",
    "Authorizer",
    "Operation",
    "PatternType",
    "Permission",
    "ResourceType",
    "parse_principal",
    "validate_binding",
    "validate_filter",
]

CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


_IMPLIES = {
    Operation.DESCRIBE: frozenset({Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.ALTER_CONFIGS}),
}
_STORABLE_TYPES = frozenset({ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER,
                             ResourceType.TRANSACTIONAL_ID, ResourceType.DELEGATION_TOKEN, ResourceType.USER})


class AclError(ValueError):
    """A binding or filter Kafka refuses (INVALID_REQUEST)."""


class AclBinding(NamedTuple):
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int

    def to_json(self) -> bytes:
        return json.dumps(list(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | str | list[object]) -> AclBinding:
        v = json.loads(raw) if isinstance(raw, (bytes, str)) else raw
        if not isinstance(v, list) or len(v) != 7:
            raise ValueError(f"not an ACL binding: {v!r}")
        return cls(int(v[0]), str(v[1]), int(v[2]), str(v[3]), str(v[4]), int(v[5]), int(v[6]))  # type: ignore[arg-type]

    def key(self) -> str:
        """A name for the binding made of its content (its etcd key)."""
        return hashlib.sha256(self.to_json()).hexdigest()[:40]

    def describe(self) -> str:
        return (f"(pattern=ResourcePattern(resourceType={_name(ResourceType, self.resource_type)}, "
                f"name={self.resource_name}, patternType={_name(PatternType, self.pattern_type)}), "
                f"entry=(principal={self.principal}, host={self.host}, "
                f"operation={_name(Operation, self.operation)}, "
                f"permissionType={_name(Permission, self.permission)}))")


def _name(enum_cls: type[enum.IntEnum], value: int) -> str:
    try:
        return enum_cls(value).name
    except ValueError:
        return str(value)


def parse_principal(principal: str) -> tuple[str, str]:
    """(type, name) of ``Type:name``; AclError when it is not of that form."""
    kind, sep, name = principal.partition(":")
    if not sep or not kind or not name:
        raise AclError(f"Could not parse principal from `{principal}` (no colon is present separating the "
                       "principal type from the principal name)")
    return kind, name


def validate_binding(b: AclBinding) -> None:
    """Raise AclError as Kafka refuses a binding to create."""
    if b.resource_type not in _STORABLE_TYPES:
        raise AclError(f"Invalid resource type {_name(ResourceType, b.resource_type)}")
    if b.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise AclError(f"Invalid pattern type {_name(PatternType, b.pattern_type)}")
    if not b.resource_name:
        raise AclError("Resource name must not be empty")
    if b.resource_type == ResourceType.CLUSTER and b.resource_name != CLUSTER_NAME:
        raise AclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if b.operation in (Operation.UNKNOWN, Operation.ANY) or b.operation not in Operation.__members__.values():
        raise AclError(f"Invalid operation {_name(Operation, b.operation)}")
    if b.permission not in (Permission.ALLOW, Permission.DENY):
        raise AclError(f"Invalid permission type {_name(Permission, b.permission)}")
    if not b.host:
        raise AclError("Host must not be empty (use * for every host)")
    parse_principal(b.principal)


class AclFilter(NamedTuple):
    resource_type: int
    resource_name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission: int

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and self.resource_type != b.resource_type:
            return False
        if not self._pattern_matches(b):
            return False
        if self.principal is not None and self.principal != b.principal:
            return False
        if self.host is not None and self.host != b.host:
            return False
        if self.operation != Operation.ANY and self.operation != b.operation:
            return False
        return self.permission == Permission.ANY or self.permission == b.permission

    def _pattern_matches(self, b: AclBinding) -> bool:
        pt, name = self.pattern_type, self.resource_name
        if pt == PatternType.ANY:
            return name is None or name == b.resource_name
        if pt == PatternType.MATCH:
            if name is None:
                return True
            if b.pattern_type == PatternType.LITERAL:
                return b.resource_name == name or b.resource_name == WILDCARD
            return b.pattern_type == PatternType.PREFIXED and name.startswith(b.resource_name)
        return pt == b.pattern_type and (name is None or name == b.resource_name)


def validate_filter(f: AclFilter) -> None:
    if f.resource_type == ResourceType.UNKNOWN:
        raise AclError("Invalid resource type UNKNOWN in the filter")
    if f.pattern_type == PatternType.UNKNOWN or f.pattern_type not in PatternType.__members__.values():
        raise AclError(f"Invalid pattern type {_name(PatternType, f.pattern_type)} in the filter")
    if f.operation == Operation.UNKNOWN:
        raise AclError("Invalid operation UNKNOWN in the filter")
    if f.permission == Permission.UNKNOWN:
        raise AclError("Invalid permission type UNKNOWN in the filter")


_CACHE_LIMIT = 65536


class Authorizer:
    """One set of bindings and the decisions made from it (cached)."""

    __slots__ = ("_cache", "_literal", "_prefixed", "allow_if_no_acl", "bindings", "super_users")

    def __init__(self, bindings: Iterable[AclBinding], super_users: Iterable[str] = (),
                 allow_if_no_acl: bool = False) -> None:
        self.bindings = frozenset(bindings)
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self._literal: dict[tuple[int, str], list[AclBinding]] = {}
        self._prefixed: dict[int, list[AclBinding]] = {}
        for b in self.bindings:
            if b.pattern_type == PatternType.PREFIXED:
                self._prefixed.setdefault(b.resource_type, []).append(b)
            else:
                self._literal.setdefault((b.resource_type, b.resource_name), []).append(b)
        self._cache: dict[tuple[str, str, int, int, str], bool] = {}

    def matching(self, resource_type: int, name: str) -> list[AclBinding]:
        """The bindings whose resource pattern applies to the resource."""
        out = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            out += self._literal.get((resource_type, WILDCARD), ())
        out += [b for b in self._prefixed.get(resource_type, ()) if name.startswith(b.resource_name)]
        return out

    def authorize(self, principal: str, host: str, operation: int, resource_type: int, name: str) -> bool:
        if principal in self.super_users:
            return True
        key = (principal, host, operation, resource_type, name)
        got = self._cache.get(key)
        if got is None:
            got = self._decide(principal, host, operation, resource_type, name)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = got
        return got

    def _decide(self, principal: str, host: str, operation: int, resource_type: int, name: str) -> bool:
        acls = self.matching(resource_type, name)
        if not acls:
            return self.allow_if_no_acl
        mine = [b for b in acls if (b.principal == principal or b.principal == WILDCARD_PRINCIPAL)
                and (b.host == WILDCARD or b.host == host)]
        if any(b.permission == Permission.DENY and b.operation in (operation, Operation.ALL) for b in mine):
            return False
        implied = _IMPLIES.get(Operation(operation), frozenset()) if operation in _IMPLIES else frozenset()
        return any(b.permission == Permission.ALLOW
                   and (b.operation == operation or b.operation == Operation.ALL or b.operation in implied)
                   for b in mine)

    def authorize_any(self, principal: str, host: str, operation: int, resource_type: int) -> bool:
        """Whether some resource of the type may be the target of ``operation`` (Kafka's
        authorizeByResourceType: an ALLOW for the principal on any name, with no DENY on all)."""
        if principal in self.super_users:
            return True
        mine = [b for b in self.bindings if b.resource_type == resource_type
                and (b.principal == principal or b.principal == WILDCARD_PRINCIPAL)
                and (b.host == WILDCARD or b.host == host) and b.operation in (operation, Operation.ALL)]
        if any(b.permission == Permission.DENY and b.resource_name in (WILDCARD, "")
               and b.pattern_type in (PatternType.LITERAL, PatternType.PREFIXED) for b in mine):
            return False
        if any(b.permission == Permission.ALLOW for b in mine):
            return True
        return self.allow_if_no_acl and not any(b.resource_type == resource_type for b in self.bindings)
