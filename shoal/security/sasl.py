"""The server side of the SASL mechanisms: PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512.

Each mechanism object takes the client's tokens one at a time (``await step(token)``)
and returns the token to send back; ``complete`` and ``username`` tell the outcome.
A failed authentication raises :class:`AuthenticationFailed` with the message Kafka
gives (it names no user and says nothing about which part was wrong).

* PLAIN (RFC 4616): ``authzid NUL user NUL password``; the users and passwords are the
  listener's JAAS ``user_<name>="<password>"`` options, compared in constant time.
* SCRAM (RFC 5802, 7677): the exchange is ``scramp``'s; the credential comes from the
  broker's store (``credentials.py``), looked up by the user named in the client's first
  message before scramp is handed it.
"""

from __future__ import annotations

import hmac
from typing import Any

__all__ = ["AuthenticationFailed", "PlainServer", "ScramServer"]


class AuthenticationFailed(Exception):
    """The client's credentials were refused; the message is for the client."""


class PlainServer:
    mechanism = "PLAIN"

    def __init__(self, users: dict[str, str]) -> None:
        self._users = users
        self.complete = False
        self.username: str | None = None

    async def step(self, token: bytes) -> bytes:
        parts = bytes(token).split(b"\x00")
        if len(parts) != 3:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: expected 3 tokens")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: not UTF-8") from None
        if not user:
            raise AuthenticationFailed("Authentication failed: username not specified")
        if not password:
            raise AuthenticationFailed("Authentication failed: password not specified")
        expected = self._users.get(user)
        # compared in constant time, also for an unknown user
        ok = hmac.compare_digest((expected or "").encode(), password.encode()) and expected is not None
        if not ok:
            raise AuthenticationFailed("Authentication failed: Invalid username or password")
        if authzid and authzid != user:
            raise AuthenticationFailed("Authentication failed: Client requested an authorization id that is "
                                       "different from username")
        self.complete = True
        self.username = user
        return b""


def client_first_username(text: str) -> str:
    """The user named in a SCRAM client-first message (``gs2-header,n=user,r=nonce...``)."""
    parts = text.split(",", 2)
    if len(parts) < 3:
        raise AuthenticationFailed("Invalid SCRAM client first message")
    for attr in parts[2].split(","):
        if attr.startswith("n="):
            return attr[2:].replace("=2C", ",").replace("=3D", "=")
    raise AuthenticationFailed("Invalid SCRAM client first message: no user name")


class ScramServer:
    def __init__(self, mechanism: str, store: Any) -> None:
        self.mechanism = mechanism
        self._store = store
        self._server: Any = None
        self._first_done = False
        self.complete = False
        self.username: str | None = None

    def _failed(self) -> AuthenticationFailed:
        return AuthenticationFailed("Authentication failed during authentication due to invalid credentials "
                                    f"with SASL mechanism {self.mechanism}")

    async def step(self, token: bytes) -> bytes:
        from scramp import ScramException, ScramMechanism

        try:
            text = bytes(token).decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid SCRAM message: not UTF-8") from None
        if not self._first_done:
            self._first_done = True
            user = client_first_username(text)
            try:
                cred = await self._store.get(user, self.mechanism)
            except OSError:
                raise AuthenticationFailed(f"Authentication failed: credentials for SASL mechanism {self.mechanism} "
                                           "cannot be read now") from None
            if cred is None:
                raise self._failed()
            self._server = ScramMechanism(self.mechanism).make_server(
                lambda _u: (cred.salt, cred.stored_key, cred.server_key, cred.iterations))
            try:
                self._server.set_client_first(text)
                out = self._server.get_server_first()
            except ScramException:
                raise self._failed() from None
            self.username = user
            return out.encode()
        if self._server is None or self.complete:
            raise AuthenticationFailed(f"Unexpected SASL/{self.mechanism} message")
        try:
            self._server.set_client_final(text)
            out = self._server.get_server_final()
        except ScramException:
            raise self._failed() from None
        self.complete = True
        return out.encode()
