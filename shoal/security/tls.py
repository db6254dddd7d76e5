"""TLS for SSL and SASL_SSL listeners, and for connections to other brokers (Python's ssl).

Keystore (the broker's key and certificate chain), from the listener's
``listener.name.<listener>.ssl.*`` keys or the broker's ``ssl.*`` keys:

* ``ssl.keystore.type=PEM`` with ``ssl.keystore.key`` and ``ssl.keystore.certificate.chain``
  given inline (PEM text), the key encrypted with ``ssl.key.password`` if set;
* ``ssl.keystore.location``: a PEM file holding the private key and the certificates
  (``ssl.key.password`` for an encrypted key), or a PKCS12 file (``ssl.keystore.password``),
  read with the ``cryptography`` package. JKS files are refused with a hint to convert.

Truststore (CAs that client certificates, and other brokers' certificates, are checked
against): ``ssl.truststore.location`` (PEM or PKCS12) or ``ssl.truststore.certificates``
inline; without one, the system's CAs.

``ssl.client.auth``: ``required`` (CERT_REQUIRED), ``requested`` (CERT_OPTIONAL: a
certificate sent is verified), ``none``. TLS 1.2 and 1.3 only (``ssl.enabled.protocols``).

The principal of a TLS connection is ``User:`` and the verified client certificate's
subject as an RFC 2253 string (``CN=alice,OU=eng,O=example``, most specific first, as
Java's ``X500Principal.getName()``), or ``User:ANONYMOUS`` without one.

Python's ssl loads keys only from files: a key given inline or read from PKCS12 is
written to a file readable only by this process's user in a fresh private directory,
loaded, and deleted at once.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["TlsConfigError", "client_context", "peer_principal", "server_context"]


class TlsConfigError(ValueError):
    """A keystore or truststore setting that cannot be used."""


Get = Callable[[str], Any]

_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


def _protocols(get: Get, ctx: ssl.SSLContext) -> None:
    raw = get("ssl.enabled.protocols")
    names = raw if isinstance(raw, list) else [x.strip() for x in str(raw).split(",") if x.strip()]
    versions = [_VERSIONS[n] for n in names if n in _VERSIONS]
    if not versions:
        raise TlsConfigError(f"ssl.enabled.protocols: {raw!r} names neither TLSv1.2 nor TLSv1.3")
    ctx.minimum_version = min(versions)
    ctx.maximum_version = max(versions)


def _is_pem(data: bytes) -> bool:
    return b"-----BEGIN" in data[:4096]


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise TlsConfigError(f"{what} {path}: {e.strerror or e}") from None


def _load_pem_chain(ctx: ssl.SSLContext, chain: bytes, key: bytes | None, password: str | None) -> None:
    """Load a certificate chain and key (PEM bytes) through files only this user can read."""
    with tempfile.TemporaryDirectory(prefix="shoal-tls-") as tmp:
        os.chmod(tmp, 0o700)
        cert_path = os.path.join(tmp, "chain.pem")
        fd = os.open(cert_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(chain)
        key_path = None
        if key is not None:
            key_path = os.path.join(tmp, "key.pem")
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key)
        try:
            # a callable: OpenSSL never prompts on the terminal for an encrypted key's password
            ctx.load_cert_chain(cert_path, key_path, password=lambda: password or "")
        except (ssl.SSLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", None) or e
            raise TlsConfigError(f"the keystore's key and certificates cannot be used ({reason}): not PEM, "
                                 "or a key that does not match, or a wrong or missing ssl.key.password") from None


def _pkcs12(data: bytes, password: str | None, what: str) -> Any:
    try:
        from cryptography.hazmat.primitives.serialization import pkcs12
    except ImportError:
        raise TlsConfigError(f"{what}: reading PKCS12 needs the cryptography package; or use PEM") from None
    try:
        return pkcs12.load_pkcs12(data, password.encode() if password else None)
    except (ValueError, TypeError) as e:
        raise TlsConfigError(f"{what}: not a PKCS12 file, or a wrong password: {e}") from None


def _store_type(get: Get, prefix: str, inline_key: str, data: bytes | None) -> str:
    kind = str(get(f"ssl.{prefix}.type") or "").upper()
    if kind == "JKS":
        raise TlsConfigError(f"ssl.{prefix}.type=JKS is not supported: convert the file with `keytool "
                             "-importkeystore -deststoretype PKCS12` or use PEM")
    if kind:
        return kind
    if get(inline_key) or (data is not None and _is_pem(data)):
        return "PEM"
    return "PKCS12"


def load_keystore(get: Get, ctx: ssl.SSLContext, *, required: bool) -> bool:
    """Load the keystore into ``ctx``; False when none is configured (and not ``required``)."""
    location = get("ssl.keystore.location") or ""
    if not location and not get("ssl.keystore.key") and not get("ssl.keystore.certificate.chain"):
        if required:
            raise TlsConfigError("an SSL listener needs a keystore: ssl.keystore.location, or "
                                 "ssl.keystore.type=PEM with ssl.keystore.key and ssl.keystore.certificate.chain")
        return False
    data = _read(location, "ssl.keystore.location") if location else None
    kind = _store_type(get, "keystore", "ssl.keystore.key", data)
    key_password = get("ssl.key.password") or None
    if kind == "PEM":
        inline_key, inline_chain = get("ssl.keystore.key") or "", get("ssl.keystore.certificate.chain") or ""
        if inline_key or inline_chain:
            if not (inline_key and inline_chain):
                raise TlsConfigError("ssl.keystore.key and ssl.keystore.certificate.chain go together")
            _load_pem_chain(ctx, inline_chain.encode(), inline_key.encode(), key_password)
            return True
        if data is None:
            if required:
                raise TlsConfigError("an SSL listener needs a keystore: ssl.keystore.location, or "
                                     "ssl.keystore.type=PEM with ssl.keystore.key and ssl.keystore.certificate.chain")
            return False
        _load_pem_chain(ctx, data, None, key_password)
        return True
    if data is None:
        if required:
            raise TlsConfigError(f"ssl.keystore.type={kind} needs ssl.keystore.location")
        return False
    from cryptography.hazmat.primitives import serialization

    store = _pkcs12(data, get("ssl.keystore.password") or key_password, "ssl.keystore.location")
    if store.key is None or store.cert is None:
        raise TlsConfigError("ssl.keystore.location: the PKCS12 file holds no private key and certificate")
    key = store.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
    chain = b"".join(c.public_bytes(serialization.Encoding.PEM)
                     for c in [store.cert.certificate, *(a.certificate for a in store.additional_certs)])
    _load_pem_chain(ctx, chain, key, None)
    return True


def load_truststore(get: Get, ctx: ssl.SSLContext) -> bool:
    """Load the truststore's CAs into ``ctx``; False when none is configured."""
    location = get("ssl.truststore.location") or ""
    data = _read(location, "ssl.truststore.location") if location else None
    kind = _store_type(get, "truststore", "ssl.truststore.certificates", data)
    try:
        if kind == "PEM":
            text = get("ssl.truststore.certificates") or (data.decode("ascii", "replace") if data else "")
            if not text:
                return False
            ctx.load_verify_locations(cadata=text)
            return True
        if data is None:
            return False
        from cryptography.hazmat.primitives import serialization

        store = _pkcs12(data, get("ssl.truststore.password") or None, "ssl.truststore.location")
        certs = [a.certificate for a in store.additional_certs]
        if store.cert is not None:
            certs.append(store.cert.certificate)
        if not certs:
            raise TlsConfigError("ssl.truststore.location: the PKCS12 file holds no certificate")
        ctx.load_verify_locations(cadata="".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs))
        return True
    except ssl.SSLError as e:
        raise TlsConfigError(f"the truststore's certificates cannot be used: {e.reason or e}") from None


def server_context(get: Get) -> ssl.SSLContext:
    """The SSLContext of an SSL or SASL_SSL listener. Raises TlsConfigError."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _protocols(get, ctx)
    load_keystore(get, ctx, required=True)
    auth = str(get("ssl.client.auth") or "none").lower()
    if auth not in ("none", "requested", "required"):
        raise TlsConfigError(f"ssl.client.auth: {auth!r} is not required, requested or none")
    if auth != "none":
        if not load_truststore(get, ctx):
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        ctx.verify_mode = ssl.CERT_REQUIRED if auth == "required" else ssl.CERT_OPTIONAL
    return ctx


def client_context(get: Get) -> ssl.SSLContext:
    """The SSLContext this broker connects to another broker's SSL listener with."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _protocols(get, ctx)
    if not load_truststore(get, ctx):
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    ctx.check_hostname = bool(get("ssl.endpoint.identification.algorithm"))
    load_keystore(get, ctx, required=False)  # our certificate, for a listener that wants one
    return ctx


_SHORT = {
    "commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
    "localityName": "L", "stateOrProvinceName": "ST", "streetAddress": "STREET", "domainComponent": "DC",
    "userId": "UID", "emailAddress": "EMAILADDRESS",
}


def _escape(value: str) -> str:
    out = "".join("\\" + ch if ch in ',+"\\<>;=' else ch for ch in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def subject_name(subject: Any) -> str:
    """An ``SSLSocket.getpeercert()`` subject as an RFC 2253 string (most specific first)."""
    rdns = []
    for rdn in reversed(subject or ()):
        rdns.append("+".join(f"{_SHORT.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(rdns)


def peer_principal(ssl_object: Any) -> str:
    """``User:<subject>`` of the verified client certificate, else ``User:ANONYMOUS``."""
    cert = ssl_object.getpeercert() if ssl_object is not None else None
    if not cert or not cert.get("subject"):
        return "User:ANONYMOUS"
    return "User:" + subject_name(cert["subject"])
