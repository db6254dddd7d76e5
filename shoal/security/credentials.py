"""SCRAM credentials: what the broker keeps per user and mechanism, and where.

A credential is Kafka's: the salt, the stored key, the server key and the iteration
count (RFC 5802), never the password. AlterUserScramCredentials sends the salted
password; the keys are derived from it here as Kafka's ScramFormatter does.

* One broker: ``<data dir>/scram-credentials.json``, rewritten whole and atomically
  (temporary file, fsync, rename) on every change.
* A cluster (``metadata.store=etcd://``): one etcd key per user and mechanism,
  ``/shoal/scram_credentials/<user, percent-encoded>/<mechanism>``, so every broker
  authenticates every user at once. Read from etcd at each authentication.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from ..log.partition_log import atomic_write

log = logging.getLogger("shoal.security")

__all__ = [
    "MAX_ITERATIONS",
    "MECHANISMS",
    "MECHANISM_IDS",
    "MIN_ITERATIONS",
    "ScramCredential",
    "credential_from_password",
    "credential_from_salted_password",
    "scram_store",
]

MECHANISMS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
MECHANISM_IDS = {v: k for k, v in MECHANISMS.items()}
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
_HASH = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_json(self) -> dict[str, Any]:
        b64 = base64.b64encode
        return {"salt": b64(self.salt).decode(), "stored_key": b64(self.stored_key).decode(),
                "server_key": b64(self.server_key).decode(), "iterations": self.iterations}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ScramCredential:
        dec = base64.b64decode
        return cls(dec(d["salt"]), dec(d["stored_key"]), dec(d["server_key"]), int(d["iterations"]))


def credential_from_salted_password(mechanism: str, salt: bytes, salted_password: bytes,
                                    iterations: int) -> ScramCredential:
    """The stored and server keys of RFC 5802 from the salted password."""
    h = _HASH[mechanism]
    client_key = hmac.new(salted_password, b"Client Key", h).digest()
    server_key = hmac.new(salted_password, b"Server Key", h).digest()
    return ScramCredential(salt, h(client_key).digest(), server_key, iterations)


def credential_from_password(mechanism: str, password: str, iterations: int = MIN_ITERATIONS) -> ScramCredential:
    from scramp import ScramMechanism

    salt, stored_key, server_key, i = ScramMechanism(mechanism).make_auth_info(password, iteration_count=iterations)
    return ScramCredential(salt, stored_key, server_key, i)


Change = tuple[str, str, "ScramCredential | None"]
"""(user, mechanism, credential; None deletes it)."""


class LocalScramStore:
    """Credentials in one JSON file of the data directory. Event loop only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._users: dict[str, dict[str, ScramCredential]] = {}
        if path.exists():
            try:
                raw = json.loads(path.read_text())
                self._users = {u: {m: ScramCredential.from_json(c) for m, c in mechs.items()}
                               for u, mechs in raw.get("users", {}).items()}
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise OSError(f"{path} is unreadable ({e}); SCRAM users cannot be authenticated") from None

    async def get(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._users.get(user, {}).get(mechanism)

    async def users(self) -> dict[str, dict[str, ScramCredential]]:
        return {u: dict(m) for u, m in self._users.items()}

    async def alter(self, changes: list[Change]) -> None:
        """Apply every change and write the file once; raises OSError (then nothing changed)."""
        users = {u: dict(m) for u, m in self._users.items()}
        for user, mech, cred in changes:
            if cred is None:
                users.get(user, {}).pop(mech, None)
                if user in users and not users[user]:
                    del users[user]
            else:
                users.setdefault(user, {})[mech] = cred
        data = {"version": 1, "users": {u: {m: c.to_json() for m, c in ms.items()} for u, ms in sorted(users.items())}}
        atomic_write(self.path, json.dumps(data, indent=1, sort_keys=True).encode())
        self._users = users


_PREFIX = b"/shoal/scram_credentials/"


def _key(user: str, mechanism: str = "") -> bytes:
    return _PREFIX + quote(user, safe="").encode() + b"/" + mechanism.encode()


class EtcdScramStore:
    """Credentials in etcd, shared by the cluster. Raises OSError when etcd fails."""

    def __init__(self, client: Any) -> None:
        self._client = client

    async def get(self, user: str, mechanism: str) -> ScramCredential | None:
        try:
            got = await self._client.get(_key(user, mechanism))
        except Exception as e:
            raise OSError(f"reading SCRAM credentials from etcd failed: {e}") from e
        return None if got is None else ScramCredential.from_json(json.loads(got.value))

    async def users(self) -> dict[str, dict[str, ScramCredential]]:
        try:
            got = await self._client.get_prefix(_PREFIX)
        except Exception as e:
            raise OSError(f"reading SCRAM credentials from etcd failed: {e}") from e
        out: dict[str, dict[str, ScramCredential]] = {}
        for kv in got:
            user, _, mech = kv.key[len(_PREFIX):].decode().partition("/")
            try:
                out.setdefault(unquote(user), {})[mech] = ScramCredential.from_json(json.loads(kv.value))
            except (ValueError, KeyError, TypeError):
                log.error("ignoring a malformed SCRAM credential in etcd for %r", unquote(user))
        return out

    async def alter(self, changes: list[Change]) -> None:
        c = self._client
        ops = [c.transactions.delete(_key(u, m)) if cred is None
               else c.transactions.put(_key(u, m), json.dumps(cred.to_json(), sort_keys=True).encode())
               for u, m, cred in changes]
        try:
            await c.transaction(compare=[], success=ops, failure=[])
        except Exception as e:
            raise OSError(f"writing SCRAM credentials to etcd failed: {e}") from e


def scram_store(broker: Any) -> LocalScramStore | EtcdScramStore:
    """The broker's credential store (created on first use)."""
    store = broker.extensions.get("scram")
    if store is None:
        if getattr(broker.cluster, "clustered", False):
            store = EtcdScramStore(broker.cluster.store.client)
        else:
            store = LocalScramStore(broker.data_dir / "scram-credentials.json")
        broker.extensions["scram"] = store
    return store
