"""The authorization decision and the ACL filters (shoal/security/acls.py), as Kafka's StandardAuthorizer."""

from __future__ import annotations

import pytest

from shoal.security.acls import (
    AclBinding,
    AclError,
    AclFilter,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    validate_binding,
)

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def acl(rt: int, name: str, op: int, principal: str = "User:alice", *, pattern: int = LIT, host: str = "*",
        perm: int = ALLOW) -> AclBinding:
    return AclBinding(rt, name, pattern, principal, host, op, perm)


def test_nothing_is_allowed_without_an_acl_unless_allow_everyone() -> None:
    az = Authorizer([acl(T, "other", Operation.READ)])
    assert not az.authorize("User:alice", "10.0.0.1", Operation.READ, T, "orders")
    assert Authorizer([], allow_if_no_acl=True).authorize("User:bob", "h", Operation.WRITE, T, "orders")
    # a resource some ACL names is closed to the others even with allow.everyone.if.no.acl.found
    az = Authorizer([acl(T, "orders", Operation.READ)], allow_if_no_acl=True)
    assert not az.authorize("User:bob", "h", Operation.READ, T, "orders")
    assert az.authorize("User:bob", "h", Operation.READ, T, "unnamed")


def test_literal_wildcard_and_prefixed_patterns() -> None:
    az = Authorizer([acl(T, "orders", Operation.READ), acl(G, "*", Operation.READ),
                     acl(T, "pay-", Operation.WRITE, pattern=PRE)])
    assert az.authorize("User:alice", "h", Operation.READ, T, "orders")
    assert not az.authorize("User:alice", "h", Operation.READ, T, "orders2")
    assert az.authorize("User:alice", "h", Operation.READ, G, "any-group")
    assert az.authorize("User:alice", "h", Operation.WRITE, T, "pay-eu")
    assert not az.authorize("User:alice", "h", Operation.WRITE, T, "pa")
    assert not az.authorize("User:bob", "h", Operation.READ, T, "orders")


def test_deny_wins_and_host_and_wildcard_principal() -> None:
    az = Authorizer([acl(T, "orders", Operation.ALL, "User:*"),
                     acl(T, "orders", Operation.READ, "User:bob", perm=DENY),
                     acl(T, "orders", Operation.WRITE, "User:carol", host="10.0.0.9", perm=DENY)])
    assert az.authorize("User:alice", "h", Operation.READ, T, "orders")
    assert not az.authorize("User:bob", "h", Operation.READ, T, "orders")
    assert az.authorize("User:bob", "h", Operation.WRITE, T, "orders")
    assert not az.authorize("User:carol", "10.0.0.9", Operation.WRITE, T, "orders")
    assert az.authorize("User:carol", "10.0.0.8", Operation.WRITE, T, "orders")
    # DENY ALL denies every operation, a prefixed DENY too
    az = Authorizer([acl(G, "g", Operation.READ), acl(G, "", Operation.ALL, pattern=PRE, perm=DENY)])
    assert not az.authorize("User:alice", "h", Operation.READ, G, "g")


def test_implied_operations() -> None:
    for op in (Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER):
        assert Authorizer([acl(T, "t", op)]).authorize("User:alice", "h", Operation.DESCRIBE, T, "t")
    assert not Authorizer([acl(T, "t", Operation.CREATE)]).authorize("User:alice", "h", Operation.DESCRIBE, T, "t")
    assert Authorizer([acl(T, "t", Operation.ALTER_CONFIGS)]).authorize(
        "User:alice", "h", Operation.DESCRIBE_CONFIGS, T, "t")
    assert not Authorizer([acl(T, "t", Operation.DESCRIBE)]).authorize("User:alice", "h", Operation.READ, T, "t")
    # a DENY of READ does not deny the DESCRIBE another ALLOW gives
    az = Authorizer([acl(T, "t", Operation.WRITE), acl(T, "t", Operation.READ, perm=DENY)])
    assert az.authorize("User:alice", "h", Operation.DESCRIBE, T, "t")


def test_super_users_and_the_any_topic_check() -> None:
    az = Authorizer([acl(T, "t", Operation.READ, "User:bob", perm=DENY)], super_users={"User:admin"})
    assert az.authorize("User:admin", "h", Operation.ALTER, C, "kafka-cluster")
    assert not az.authorize("User:bob", "h", Operation.READ, T, "t")
    assert Authorizer([acl(T, "x-", Operation.WRITE, pattern=PRE)]).authorize_any("User:alice", "h", Operation.WRITE, T)
    assert not Authorizer([acl(T, "x", Operation.READ)]).authorize_any("User:alice", "h", Operation.WRITE, T)


def test_filters_match_as_kafka() -> None:
    lit = acl(T, "orders", Operation.READ)
    star = acl(T, "*", Operation.READ)
    pre = acl(T, "ord", Operation.READ, pattern=PRE)
    other = acl(G, "orders", Operation.READ, "User:bob", perm=DENY)
    every = [lit, star, pre, other]

    def f(rt: int = ResourceType.ANY, name: str | None = None, pt: int = PatternType.ANY, principal: str | None = None,
          op: int = Operation.ANY, perm: int = Permission.ANY) -> list[AclBinding]:
        flt = AclFilter(rt, name, pt, principal, None, op, perm)
        return [b for b in every if flt.matches(b)]

    assert f() == every
    assert f(T) == [lit, star, pre]
    assert f(T, "orders", PatternType.MATCH) == [lit, star, pre]
    assert f(T, "orders", LIT) == [lit]
    assert f(T, "ord", PRE) == [pre]
    assert f(name="orders") == [lit, other]
    assert f(principal="User:bob") == [other]
    assert f(perm=DENY) == [other]


@pytest.mark.parametrize("binding", [
    acl(T, "t", Operation.READ, pattern=PatternType.MATCH),
    acl(T, "t", Operation.ANY),
    acl(T, "t", Operation.READ, perm=Permission.ANY),
    acl(C, "other", Operation.ALTER),
    acl(T, "", Operation.READ),
    acl(T, "t", Operation.READ, "alice"),
    acl(ResourceType.ANY, "t", Operation.READ),
])
def test_bindings_kafka_refuses(binding: AclBinding) -> None:
    with pytest.raises(AclError):
        validate_binding(binding)


def test_binding_round_trips_through_json() -> None:
    b = acl(T, "naïve/topic", Operation.WRITE, "User:CN=x,O=y", host="::1", perm=DENY)
    assert AclBinding.from_json(b.to_json()) == b
    assert b.key() == AclBinding.from_json(b.to_json()).key()
