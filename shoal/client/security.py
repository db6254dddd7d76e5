"""TLS and SASL for :class:`~shoal.client.connection.Connection`, from Kafka client properties.

:func:`ClientSecurity.from_properties` reads the settings a Kafka client reads (the file
given to a tool with ``--command-config``), in Apache Kafka's names or librdkafka's:

* ``security.protocol``: PLAINTEXT (the default), SSL, SASL_PLAINTEXT or SASL_SSL.
* TLS: the CAs the broker's certificate is checked against come from
  ``ssl.truststore.location`` (PEM or PKCS12, ``ssl.truststore.password``),
  ``ssl.truststore.certificates`` (PEM text) or librdkafka's ``ssl.ca.location`` (PEM);
  without any, the system's CAs. ``ssl.endpoint.identification.algorithm`` (``https``, the
  default, checks that the certificate names the host; empty or ``none`` does not). A
  client certificate for mutual TLS comes from ``ssl.keystore.location`` (a PEM file of key
  and chain, or PKCS12 with ``ssl.keystore.password``), ``ssl.keystore.type=PEM`` with
  ``ssl.keystore.key`` and ``ssl.keystore.certificate.chain`` inline, or librdkafka's
  ``ssl.certificate.location`` and ``ssl.key.location``; an encrypted key's password is
  ``ssl.key.password``. ``ssl.enabled.protocols`` (TLSv1.2 and TLSv1.3 by default).
* SASL: ``sasl.mechanism`` (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; Kafka's default GSSAPI
  is refused), and the login from ``sasl.jaas.config``'s ``username`` and ``password``
  (PlainLoginModule or ScramLoginModule) or librdkafka's ``sasl.username`` and
  ``sasl.password``.

Bad or missing settings raise :class:`SecurityConfigError` with one line naming the setting.
The SASL exchange itself is :meth:`Connection._authenticate`.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MECHANISMS", "PROTOCOLS", "ClientSecurity", "SecurityConfigError"]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_DEFAULTS = {"ssl.enabled.protocols": "TLSv1.2,TLSv1.3", "ssl.endpoint.identification.algorithm": "https"}


class SecurityConfigError(ValueError):
    """A client security setting that cannot be used."""


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = None
    sasl: tuple[str, str, str] | None = None
    """(mechanism, username, password)."""

    @classmethod
    def from_properties(cls, conf: Mapping[str, Any]) -> ClientSecurity:
        protocol = str(conf.get("security.protocol") or "PLAINTEXT").upper()
        if protocol not in PROTOCOLS:
            raise SecurityConfigError(f"security.protocol={protocol} is not one of {', '.join(PROTOCOLS)}")
        ctx = _tls_context(conf) if protocol in ("SSL", "SASL_SSL") else None
        sasl = _sasl_login(conf) if protocol.startswith("SASL_") else None
        return cls(protocol, ctx, sasl)


def _get(conf: Mapping[str, Any]) -> Any:
    def get(key: str) -> Any:
        value = conf.get(key)
        if value is None and key == "ssl.truststore.location":
            value = conf.get("ssl.ca.location")  # librdkafka's name for a PEM file of CAs
        return _DEFAULTS.get(key) if value is None else value

    return get


def _tls_context(conf: Mapping[str, Any]) -> ssl.SSLContext:
    from ..security.tls import TlsConfigError, client_context

    get = _get(conf)
    algorithm = str(get("ssl.endpoint.identification.algorithm")).strip().lower()
    if algorithm not in ("", "none", "https"):
        raise SecurityConfigError(f"ssl.endpoint.identification.algorithm={algorithm}: expected https or empty")
    try:
        ctx = client_context(lambda k: "" if k == "ssl.endpoint.identification.algorithm" and algorithm == "none"
                             else get(k))
        cert, key = conf.get("ssl.certificate.location"), conf.get("ssl.key.location")
        if cert or key:
            if not (cert and key):
                raise SecurityConfigError("ssl.certificate.location and ssl.key.location go together")
            ctx.load_cert_chain(str(cert), str(key), conf.get("ssl.key.password") or None)
    except TlsConfigError as e:
        raise SecurityConfigError(str(e)) from None
    except (OSError, ssl.SSLError) as e:
        raise SecurityConfigError(f"the client certificate or key cannot be used: {e.strerror or e}") from None
    if str(conf.get("enable.ssl.certificate.verification", "true")).lower() == "false":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _sasl_login(conf: Mapping[str, Any]) -> tuple[str, str, str]:
    mechanism = str(conf.get("sasl.mechanism") or conf.get("sasl.mechanisms") or "GSSAPI").upper()
    if mechanism not in MECHANISMS:
        raise SecurityConfigError(f"sasl.mechanism={mechanism} is not supported: use {', '.join(MECHANISMS)}")
    user, password = conf.get("sasl.username"), conf.get("sasl.password")
    jaas = conf.get("sasl.jaas.config")
    if jaas:
        from ..security.jaas import login_credentials, parse_jaas

        try:
            login = login_credentials(parse_jaas(str(jaas)))
        except ValueError as e:
            raise SecurityConfigError(str(e)) from None
        if login is None:
            raise SecurityConfigError("sasl.jaas.config names no username and password")
        user, password = login
    if user is None or password is None:
        raise SecurityConfigError(f"security.protocol={conf.get('security.protocol')} needs a login: "
                                  "sasl.jaas.config with username and password, or sasl.username and sasl.password")
    return mechanism, str(user), str(password)
