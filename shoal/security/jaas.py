"""Kafka's JAAS lines (``sasl.jaas.config``), parsed (pure).

``<LoginModule class> <flag> key="value" key2=value2 ... ;`` -- one or more modules, each
ending with ``;``. What shoal reads from them:

* PlainLoginModule: ``user_<name>="<password>"`` options are the PLAIN users this broker
  accepts (as Kafka's PlainServerCallbackHandler reads them);
* any module: ``username`` and ``password`` are what this broker logs in with when it
  connects to another broker (inter-broker SASL).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["JaasError", "JaasModule", "login_credentials", "parse_jaas", "plain_users"]

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"

_TOKEN = re.compile(r'\s*(?:(;)|([A-Za-z_][\w.$-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;"]+))|([^\s=;"]+))')


class JaasError(ValueError):
    """A JAAS line that does not parse."""


@dataclass(slots=True)
class JaasModule:
    name: str
    flag: str
    options: dict[str, str] = field(default_factory=dict)


def parse_jaas(text: str) -> list[JaasModule]:
    """Every login module of ``text``. Raises JaasError (without echoing any value)."""
    modules: list[JaasModule] = []
    current: JaasModule | None = None
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise JaasError(f"sasl.jaas.config does not parse at character {pos}")
        pos = m.end()
        end, key, quoted, bare, word = m.groups()
        if end:
            if current is None:
                raise JaasError("sasl.jaas.config: ';' before a login module")
            modules.append(current)
            current = None
        elif key is not None:
            if current is None or not current.flag:
                raise JaasError("sasl.jaas.config: an option before the login module and its flag")
            value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
            current.options[key] = value
        elif current is None:
            current = JaasModule(word, "")
        elif not current.flag:
            if word.lower() not in ("required", "requisite", "sufficient", "optional"):
                raise JaasError(f"sasl.jaas.config: {word!r} is not a control flag (required, requisite, "
                                "sufficient, optional)")
            current.flag = word.lower()
        else:
            raise JaasError("sasl.jaas.config: expected key=value")
    if current is not None:
        raise JaasError("sasl.jaas.config must end with ';'")
    return modules


def plain_users(modules: list[JaasModule]) -> dict[str, str]:
    """The ``user_<name>="<password>"`` options of the PlainLoginModule entries."""
    out: dict[str, str] = {}
    for m in modules:
        if m.name == PLAIN_MODULE:
            for k, v in m.options.items():
                if k.startswith("user_") and len(k) > 5:
                    out[k[5:]] = v
    return out


def login_credentials(modules: list[JaasModule]) -> tuple[str, str] | None:
    """(username, password) of the first module that has both."""
    for m in modules:
        if "username" in m.options and "password" in m.options:
            return m.options["username"], m.options["password"]
    return None
