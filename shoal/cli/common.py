"""What every client tool shares: connection options, the reachability check, errors, output.

* ``add_connection_options`` adds ``--bootstrap-server``, ``--command-config`` (a Kafka
  client properties file, e.g. ``client.id``) and ``--timeout`` (milliseconds).
* ``reach`` opens one connection to the first broker of ``--bootstrap-server`` that
  answers ApiVersions within ``--timeout``; it raises :class:`CliError` (one line) when
  none does, so a wrong address never ends in a hang or a traceback.
* ``tool_main`` runs a tool: :class:`CliError`, a Kafka client error or a lost connection
  become one ``Error: ...`` line on stderr and exit code 1; Ctrl-C exits 130.
* ``emit`` prints rows as Kafka's space-aligned tables, or as JSON (``--output json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import ssl
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..config import load_properties

__all__ = [
    "CliError",
    "Progress",
    "add_connection_options",
    "add_output_options",
    "admin_client",
    "client_config",
    "client_security",
    "emit",
    "error_code",
    "group_limit_text",
    "is_group_full",
    "kafka_error_text",
    "librdkafka_config",
    "quiet_logger",
    "reach",
    "timeout_s",
    "tool_main",
    "verbose",
]

DEFAULT_TIMEOUT_MS = 10_000


class CliError(Exception):
    """A one-line error for the user; the tool exits with ``code``."""

    def __init__(self, message: str, code: int = 1, prefix: str = "Error: ") -> None:
        super().__init__(message)
        self.code = code
        self.prefix = prefix


def add_connection_options(p: argparse.ArgumentParser, *, timeout_help: str | None = None) -> None:
    p.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,HOST:PORT...]",
                   help="the broker(s) to connect to")
    p.add_argument("--command-config", metavar="FILE",
                   help="a properties file of Kafka client settings (client.id, ...), passed to the client")
    p.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_MS, metavar="MS",
                   help=timeout_help or f"how long to wait for the broker, in ms (default {DEFAULT_TIMEOUT_MS})")
    p.add_argument("--verbose", action="store_true", help="say what the tool does, on stderr")


def add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", choices=("text", "json"), default="text",
                   help="text (Kafka's tables, the default) or json (one JSON document, for scripts)")


def timeout_s(args: argparse.Namespace) -> float:
    return max(0.1, getattr(args, "timeout", DEFAULT_TIMEOUT_MS) / 1000.0)


def verbose(args: argparse.Namespace, message: str) -> None:
    if getattr(args, "verbose", False):
        print(message, file=sys.stderr, flush=True)


def client_config(args: argparse.Namespace, *extra_files: str | None) -> dict[str, str]:
    """Client settings from ``--command-config`` (and other properties files), as strings."""
    conf: dict[str, str] = {}
    for path in (getattr(args, "command_config", None), *extra_files):
        if not path:
            continue
        try:
            conf.update(load_properties(Path(path).read_text()))
        except OSError as e:
            raise CliError(f"cannot read {path}: {e.strerror or e}") from None
    conf.pop("bootstrap.servers", None)
    return conf


def _parse_servers(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        item = item.strip().split("://")[-1]
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise CliError(f"invalid --bootstrap-server {bootstrap!r}: expected HOST:PORT[,HOST:PORT...]")
        out.append((host.strip("[]") or "127.0.0.1", int(port)))
    if not out:
        raise CliError("--bootstrap-server is empty")
    return out


def client_security(conf: dict[str, str]) -> Any:
    """The :class:`~shoal.client.security.ClientSecurity` of ``--command-config``'s settings."""
    from ..client.security import ClientSecurity, SecurityConfigError

    try:
        return ClientSecurity.from_properties(conf)
    except SecurityConfigError as e:
        raise CliError(f"--command-config: {e}") from None


def reach(args: argparse.Namespace, client_id: str = "shoal-tools") -> Any:
    """An open :class:`~shoal.client.connection.Connection` to the first broker that answers,
    over TLS and authenticated with SASL as ``--command-config``'s security.protocol says."""
    from ..client.connection import AuthenticationError, Connection
    from ..errors import ProtocolViolation

    conf = client_config(args)
    security = client_security(conf)
    budget = timeout_s(args)
    deadline = time.monotonic() + budget
    last: BaseException | None = None
    for host, port in _parse_servers(args.bootstrap_server):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        conn = Connection(host, port, client_id=conf.get("client.id", client_id), timeout_s=remaining,
                          security=security)
        try:
            conn.connect()
        except AuthenticationError as e:
            # Kafka's clients stop at a refused login too: another broker would refuse it alike.
            raise CliError(f"authentication failed at {host}:{port} ({security.protocol}, "
                           f"{security.sasl[0] if security.sasl else 'TLS'}): {e}") from None
        except ssl.SSLError as e:
            reason = e.reason or str(e)
            if getattr(e, "verify_message", None):  # which check failed: issuer, host name, expiry
                reason += f": {e.verify_message}"
            hint = (" (is it a PLAINTEXT or SASL_PLAINTEXT listener?)"
                    if reason in ("UNEXPECTED_EOF_WHILE_READING", "WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE")
                    else "")
            last = ConnectionError(f"TLS handshake failed (security.protocol={security.protocol}): {reason}{hint}")
            continue
        except ProtocolViolation as e:
            last = ConnectionError(str(e))
            continue
        except (OSError, ConnectionError) as e:
            last = e
            continue
        except Exception:  # a peer that does not speak the Kafka protocol
            last = ConnectionError("the peer does not answer as a Kafka broker")
            conn.close()
            continue
        conn.timeout_s = budget
        if conn._sock is not None:
            conn._sock.settimeout(budget)
        verbose(args, f"connected to {host}:{port} (client.id {conn.client_id}, {security.protocol})")
        return conn
    reason = _reason(last) if last is not None else "no time left"
    if last is None or reason == "timed out" or time.monotonic() >= deadline:
        raise CliError(f"cannot reach a broker at {args.bootstrap_server} within {int(budget * 1000)} ms: {reason}")
    # Refused or unresolvable at once: no time limit was reached, so none is named.
    raise CliError(f"cannot reach a broker at {args.bootstrap_server}: {reason}")


def _reason(e: BaseException) -> str:
    if isinstance(e, TimeoutError) or type(e).__name__ == "timeout":
        return "timed out"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def quiet_logger() -> logging.Logger:
    """A logger for librdkafka that prints nothing: a tool reports a client's errors itself,
    in one line, instead of librdkafka's ``%0|...|FATAL|...`` lines."""
    logger = logging.getLogger("shoal.cli.librdkafka")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
        logger.propagate = False
    return logger


def librdkafka_config(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with Apache Kafka's security settings put in librdkafka's names, so that one
    ``--command-config`` serves the tools built on confluent-kafka and those on shoal's own
    client: ``sasl.jaas.config``'s login becomes ``sasl.username``/``sasl.password``, a PEM
    ``ssl.truststore.location`` becomes ``ssl.ca.location``, a PEM ``ssl.keystore.location``
    (key and chain in one file) becomes ``ssl.certificate.location``/``ssl.key.location``,
    inline PEM becomes ``ssl.ca.pem``/``ssl.certificate.pem``/``ssl.key.pem``, an empty
    ``ssl.endpoint.identification.algorithm`` becomes ``none``. A PKCS12 keystore keeps its
    name (librdkafka reads PKCS12 there); a PKCS12 or JKS truststore is refused."""
    out = dict(conf)
    jaas = out.pop("sasl.jaas.config", None)
    if jaas and "sasl.username" not in out:
        from ..client.security import _sasl_login

        protocol = out.get("security.protocol", "SASL_PLAINTEXT")
        try:
            _, out["sasl.username"], out["sasl.password"] = _sasl_login({**out, "sasl.jaas.config": jaas,
                                                                         "security.protocol": protocol})
        except ValueError as e:
            raise CliError(f"--command-config: {e}") from None
    truststore = out.pop("ssl.truststore.location", None)
    store_type = out.pop("ssl.truststore.type", "").upper()
    out.pop("ssl.truststore.password", None)
    if truststore:
        try:
            pem = store_type == "PEM" or b"-----BEGIN" in Path(truststore).read_bytes()[:4096]
        except OSError as e:
            raise CliError(f"cannot read ssl.truststore.location {truststore}: {e.strerror or e}") from None
        if not pem:
            raise CliError("--command-config: this tool reads a PEM ssl.truststore.location only (convert the "
                           "truststore with openssl pkcs12 -nokeys)")
        out.setdefault("ssl.ca.location", truststore)
    if "ssl.truststore.certificates" in out:
        out.setdefault("ssl.ca.pem", out.pop("ssl.truststore.certificates"))
    keystore_type = out.pop("ssl.keystore.type", "").upper()
    if "ssl.keystore.key" in out:
        out.setdefault("ssl.key.pem", out.pop("ssl.keystore.key"))
    if "ssl.keystore.certificate.chain" in out:
        out.setdefault("ssl.certificate.pem", out.pop("ssl.keystore.certificate.chain"))
    keystore = out.get("ssl.keystore.location")
    if keystore:
        try:
            pem = keystore_type == "PEM" or b"-----BEGIN" in Path(keystore).read_bytes()[:4096]
        except OSError as e:
            raise CliError(f"cannot read ssl.keystore.location {keystore}: {e.strerror or e}") from None
        if pem:
            del out["ssl.keystore.location"]
            out.setdefault("ssl.certificate.location", keystore)
            out.setdefault("ssl.key.location", keystore)
    if out.get("ssl.endpoint.identification.algorithm", None) == "":
        out["ssl.endpoint.identification.algorithm"] = "none"
    out.pop("ssl.enabled.protocols", None)
    return out


def admin_client(args: argparse.Namespace) -> Any:
    """confluent-kafka's AdminClient for ``--bootstrap-server`` and ``--command-config``."""
    from confluent_kafka.admin import AdminClient

    return AdminClient({**librdkafka_config(client_config(args)), "bootstrap.servers": args.bootstrap_server, "log_level": 0,
                        "logger": quiet_logger()})


def kafka_error_text(e: Any) -> str:
    """One line for a confluent-kafka KafkaException or KafkaError (or anything else), never
    the raw ``KafkaError{code=...,val=...,str="..."}``."""
    arg = e.args[0] if getattr(e, "args", None) else None
    if arg is None and hasattr(e, "str") and hasattr(e, "name"):
        arg = e  # a KafkaError itself
    if arg is not None and hasattr(arg, "str") and hasattr(arg, "name"):
        text = arg.str()
        return text if text else arg.name()
    return str(e) or type(e).__name__


def error_code(e: Any) -> int | None:
    """The Kafka error code of a confluent-kafka KafkaException or KafkaError, else None."""
    arg = e.args[0] if getattr(e, "args", None) else e
    code = getattr(arg, "code", None)
    return code() if callable(code) else None


GROUP_MAX_SIZE_REACHED = 81
_GROUP_FULL_TEXT = "group has reached maximum size"  # librdkafka's text of GROUP_MAX_SIZE_REACHED


def is_group_full(e: Any) -> bool:
    """Whether a confluent-kafka error is GROUP_MAX_SIZE_REACHED, also when librdkafka wraps it
    in a fatal error (_FATAL, whose text carries the original)."""
    return error_code(e) == GROUP_MAX_SIZE_REACHED or _GROUP_FULL_TEXT in kafka_error_text(e)


def group_limit_text(args: argparse.Namespace, group: str, kind: str) -> str:
    """What a GROUP_MAX_SIZE_REACHED refusal of ``group`` means, naming the broker config to
    change. librdkafka does not pass on the broker's error message, so for a share group
    the tool asks whether the group exists: if it does, it is full (group.share.max.size),
    else the broker serves its maximum of share groups (group.share.max.groups)."""
    if kind == "share":
        try:
            from .group_client import GroupClient

            groups = GroupClient(args, "shoal-tools")
            try:
                exists = any(str(g.group_id) == group
                             for g in groups.list_groups(states_filter=(), types_filter=("share",)))
            finally:
                groups.close()
        except (CliError, OSError, ConnectionError):
            exists = None
        if exists is False:
            return (f"share group {group} was not created: the broker already serves group.share.max.groups "
                    f"share groups (GROUP_MAX_SIZE_REACHED). Delete unused ones (shoal share-groups --list, then "
                    f"shoal share-groups --delete --group GROUP) or raise group.share.max.groups.")
        if exists:
            return (f"share group {group} already has group.share.max.size members (GROUP_MAX_SIZE_REACHED): "
                    f"stop one of them or raise group.share.max.size.")
        return (f"share group {group} was refused (GROUP_MAX_SIZE_REACHED): the broker serves "
                f"group.share.max.groups share groups already, or the group has group.share.max.size members. "
                f"Delete unused share groups (shoal share-groups --delete --group GROUP) or raise the limit.")
    return (f"group {group} already has its maximum of members (GROUP_MAX_SIZE_REACHED): group.consumer.max.size "
            f"(group.protocol=consumer) or group.max.size (classic groups); stop a member or raise the limit.")


def tool_main(name: str, body: Callable[[], int]) -> int:
    try:
        return int(body() or 0)
    except CliError as e:
        print(f"{e.prefix}{e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        try:
            sys.stdout = open("/dev/null", "w")  # noqa: SIM115 - stdout's reader went away
        except OSError:
            pass
        return 0
    except (ConnectionError, OSError) as e:
        print(f"Error: lost the connection to the broker: {_reason(e)}", file=sys.stderr)
        return 1
    except Exception as e:
        if type(e).__module__.startswith("confluent_kafka") or type(e).__name__ in (
                "KafkaException", "KafkaProtocolError", "AuthenticationError", "ProtocolViolation"):
            print(f"Error: {kafka_error_text(e)}", file=sys.stderr)
            return 1
        raise


def _key(column: str) -> str:
    return column.lower().lstrip("#").replace("-", "_").replace(" ", "_").replace("(", "").replace(")", "")


def emit(args: argparse.Namespace, header: Sequence[str], rows: Iterable[Sequence[Any]],
         json_key: str | None = None) -> None:
    """A table in Kafka's layout, or (``--output json``) a JSON list of objects keyed by column."""
    rows = [list(r) for r in rows]
    if getattr(args, "output", "text") == "json":
        keys = [_key(h) for h in header]
        doc: Any = [dict(zip(keys, r)) for r in rows]
        print(json.dumps({json_key: doc} if json_key else doc, default=str))
        return
    cells = [list(header)] + [["-" if v is None or v == "" else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        print(" ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())


class Progress:
    """A progress line on stderr every ``interval_s`` of a long run (none for short runs)."""

    def __init__(self, what: str, interval_s: float = 5.0, *, enabled: bool = True) -> None:
        self.what = what
        self.interval_s = interval_s
        self.enabled = enabled
        self.start = time.monotonic()
        self.next = self.start + interval_s
        self.count = 0
        self.printed = False

    def add(self, n: int = 1) -> None:
        self.count += n
        if self.enabled and time.monotonic() >= self.next:
            self._print()

    def _print(self) -> None:
        now = time.monotonic()
        rate = self.count / max(now - self.start, 1e-9)
        print(f"{self.what}: {self.count} records ({rate:.0f}/s)", file=sys.stderr, flush=True)
        self.printed = True
        self.next = now + self.interval_s

    def finish(self) -> None:
        if self.enabled and self.printed:
            self._print()


def free_ports(n: int) -> list[int]:
    """``n`` distinct free local ports: their sockets are bound together, so none comes twice."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
