"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51): SCRAM users.

As Kafka's controller checks them: a user named twice in one AlterUserScramCredentials
(upserted and deleted, or the same mechanism twice) is DUPLICATE_RESOURCE; an empty
name, or an iteration count outside 4096..16384, UNACCEPTABLE_CREDENTIAL; a mechanism
other than SCRAM-SHA-256 (1) and SCRAM-SHA-512 (2) UNSUPPORTED_SASL_MECHANISM; deleting
a credential that does not exist RESOURCE_NOT_FOUND. The accepted changes are written
together (``security/credentials.py``: the data directory, or etcd in a cluster); a
store that cannot be written answers KAFKA_STORAGE_ERROR (UNKNOWN_SERVER_ERROR for etcd)
for each of them. Describing a user without credentials is RESOURCE_NOT_FOUND.
"""

from __future__ import annotations

import logging
from collections import Counter

from ...errors import ErrorCode
from ...protocol.messages import alter_user_scram_credentials_response as alter_resp
from ...protocol.messages import describe_user_scram_credentials_response as describe_resp
from ...protocol.messages.alter_user_scram_credentials_request import AlterUserScramCredentialsRequest
from ...protocol.messages.describe_user_scram_credentials_request import DescribeUserScramCredentialsRequest
from ...security.credentials import (
    MAX_ITERATIONS,
    MECHANISM_IDS,
    MECHANISMS,
    MIN_ITERATIONS,
    ScramCredential,
    credential_from_salted_password,
    scram_store,
)
from ..context import RequestContext
from ..dispatch import api

log = logging.getLogger("shoal.security")


@api(50, 0, 0)
async def handle_describe_user_scram_credentials(
        ctx: RequestContext, request: DescribeUserScramCredentialsRequest,
) -> describe_resp.DescribeUserScramCredentialsResponse:
    rcls = describe_resp.DescribeUserScramCredentialsResult
    try:
        users = await scram_store(ctx.broker).users()
    except OSError as e:
        return describe_resp.DescribeUserScramCredentialsResponse(error_code=ErrorCode.unknown_server_error,
                                                                  error_message=str(e))

    def result(name: str) -> describe_resp.DescribeUserScramCredentialsResult:
        infos = tuple(describe_resp.CredentialInfo(mechanism=MECHANISM_IDS[m], iterations=c.iterations)
                      for m, c in sorted(users.get(name, {}).items()))
        return rcls(user=name, credential_infos=infos)

    if not request.users:
        results = tuple(result(name) for name in sorted(users))
    else:
        wanted = [u.name for u in request.users]
        counts = Counter(wanted)
        found: list[describe_resp.DescribeUserScramCredentialsResult] = []
        for name in dict.fromkeys(wanted):
            if counts[name] > 1:
                found.append(rcls(user=name, error_code=ErrorCode.duplicate_resource,
                                  error_message=f"Cannot describe SCRAM credentials for the same user twice in a "
                                                f"single request: {name}"))
            elif name not in users:
                found.append(rcls(user=name, error_code=ErrorCode.resource_not_found,
                                  error_message=f"Attempt to describe a user credential that does not exist: {name}"))
            else:
                found.append(result(name))
        results = tuple(found)
    return describe_resp.DescribeUserScramCredentialsResponse(results=results)


@api(51, 0, 0)
async def handle_alter_user_scram_credentials(
        ctx: RequestContext, request: AlterUserScramCredentialsRequest,
) -> alter_resp.AlterUserScramCredentialsResponse:
    rcls = alter_resp.AlterUserScramCredentialsResult
    store = scram_store(ctx.broker)
    errors: dict[str, tuple[ErrorCode, str]] = {}
    order: list[str] = []
    seen: Counter[tuple[str, int]] = Counter()
    for item in (*request.deletions, *request.upsertions):
        if item.name not in order:
            order.append(item.name)
        seen[(item.name, item.mechanism)] += 1
    for (name, _mechanism), n in seen.items():
        if n > 1:
            errors.setdefault(name, (ErrorCode.duplicate_resource,
                                     "A user credential cannot be altered twice in the same request"))
    try:
        existing = await store.users()
    except OSError as e:
        return alter_resp.AlterUserScramCredentialsResponse(results=tuple(
            rcls(user=n, error_code=ErrorCode.unknown_server_error, error_message=str(e)) for n in order))
    changes: list[tuple[str, str, ScramCredential | None]] = []
    for d in request.deletions:
        mech = MECHANISMS.get(d.mechanism)
        if d.name in errors:
            continue
        if not d.name:
            errors[d.name] = (ErrorCode.unacceptable_credential, "Username must not be empty")
        elif mech is None:
            errors[d.name] = (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism")
        elif mech not in existing.get(d.name, {}):
            errors[d.name] = (ErrorCode.resource_not_found,
                              "Attempt to delete a user credential that does not exist")
        else:
            changes.append((d.name, mech, None))
    for u in request.upsertions:
        mech = MECHANISMS.get(u.mechanism)
        if u.name in errors:
            continue
        if not u.name:
            errors[u.name] = (ErrorCode.unacceptable_credential, "Username must not be empty")
        elif mech is None:
            errors[u.name] = (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism")
        elif not MIN_ITERATIONS <= u.iterations <= MAX_ITERATIONS:
            errors[u.name] = (ErrorCode.unacceptable_credential,
                              f"Iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, not {u.iterations}")
        elif not u.salt or not u.salted_password:
            errors[u.name] = (ErrorCode.unacceptable_credential, "Salt and salted password must not be empty")
        else:
            changes.append((u.name, mech, credential_from_salted_password(mech, u.salt, u.salted_password,
                                                                          u.iterations)))
    changes = [c for c in changes if c[0] not in errors]
    if changes:
        try:
            await store.alter(changes)
        except OSError as e:
            code = ErrorCode.unknown_server_error if ctx.broker.cluster.clustered else ErrorCode.kafka_storage_error
            for name, _, _ in changes:
                errors[name] = (code, f"the credentials could not be written: {e}")
        else:
            for name, mech, cred in changes:
                log.info("SCRAM credential %s %s for user %r", "deleted" if cred is None else "set", mech, name)
    no_error: tuple[ErrorCode, str | None] = (ErrorCode.none, None)
    return alter_resp.AlterUserScramCredentialsResponse(results=tuple(
        rcls(user=n, error_code=errors.get(n, no_error)[0], error_message=errors.get(n, no_error)[1]) for n in order))
