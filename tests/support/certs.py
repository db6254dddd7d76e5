"""Certificates made by the tests themselves (the ``cryptography`` package).

``make_pki(dir)`` writes a CA, a server certificate for 127.0.0.1 and localhost, and a
client certificate, as PEM files (and the server's as PKCS12 and with an encrypted
key), and returns their paths.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Pki", "make_pki"]


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    server_pem: Path
    """The server's encrypted key and certificate chain in one PEM file (password ``key_password``)."""
    server_p12: Path
    """The server's key and certificates as PKCS12 (password ``store_password``)."""
    client_cert: Path
    client_key: Path
    client_subject: str
    """The client certificate's subject as Kafka names it (RFC 2253)."""
    other_ca: Path
    """A CA that signed nothing here."""
    key_password: str = "key-secret"
    store_password: str = "store-secret"


def _name(cn: str, org: str = "shoal-tests"):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COUNTRY_NAME, "NL"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_pki(root: Path) -> Pki:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12

    root.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject, issuer, key, signer, *, ca: bool = False, san: list | None = None):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(signer, hashes.SHA256())

    def pem_key(key, password: str | None = None) -> bytes:
        enc = (serialization.BestAvailableEncryption(password.encode()) if password
               else serialization.NoEncryption())
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)

    def pem(c) -> bytes:
        return c.public_bytes(serialization.Encoding.PEM)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = cert(_name("shoal test CA"), _name("shoal test CA"), ca_key, ca_key, ca=True)
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = cert(_name("other CA"), _name("other CA"), other_key, other_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = cert(_name("broker"), ca.subject, server_key, ca_key,
                  san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = cert(_name("alice", "clients"), ca.subject, client_key, ca_key)

    paths = {n: root / n for n in ("ca.pem", "other-ca.pem", "server.pem", "server.key", "server-all.pem",
                                   "server.p12", "client.pem", "client.key")}
    paths["ca.pem"].write_bytes(pem(ca))
    paths["other-ca.pem"].write_bytes(pem(other))
    paths["server.pem"].write_bytes(pem(server) + pem(ca))
    paths["server.key"].write_bytes(pem_key(server_key))
    paths["server-all.pem"].write_bytes(pem_key(server_key, Pki.key_password) + pem(server) + pem(ca))
    paths["server.p12"].write_bytes(pkcs12.serialize_key_and_certificates(
        b"broker", server_key, server, [ca], serialization.BestAvailableEncryption(Pki.store_password.encode())))
    paths["client.pem"].write_bytes(pem(client))
    paths["client.key"].write_bytes(pem_key(client_key))
    return Pki(paths["ca.pem"], paths["server.pem"], paths["server.key"], paths["server-all.pem"],
               paths["server.p12"], paths["client.pem"], paths["client.key"], "CN=alice,O=clients,C=NL",
               paths["other-ca.pem"])
