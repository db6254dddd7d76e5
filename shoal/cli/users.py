"""``shoal users``: SCRAM users (AlterUserScramCredentials / DescribeUserScramCredentials).

What ``kafka-configs --entity-type users --alter --add-config 'SCRAM-SHA-256=[password=...]'``
does, as its own tool:

* ``--add --user NAME --mechanism SCRAM-SHA-256|SCRAM-SHA-512 (--password PW | --password-file F)
  [--iterations N]``: create or replace the user's credential for that mechanism (the
  client salts and hashes the password; the broker never sees it);
* ``--list [--user NAME ...]``: users and their mechanisms and iteration counts;
* ``--delete --user NAME [--mechanism M]``: remove the user's credential for ``M``, or all of them.

It connects with confluent-kafka's admin client, so ``--command-config`` may name any
listener's settings (``security.protocol=SASL_SSL``, ``sasl.mechanism``, ``ssl.ca.location``, ...).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import CliError, add_connection_options, add_output_options, admin_client, emit, timeout_s, tool_main
from .main import command

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def _configure(p: argparse.ArgumentParser) -> None:
    add_connection_options(p)
    add_output_options(p)
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--add", action="store_true", help="create or replace a user's SCRAM credential")
    action.add_argument("--list", action="store_true", help="list users and their SCRAM mechanisms")
    action.add_argument("--delete", action="store_true", help="delete a user's SCRAM credential(s)")
    p.add_argument("--user", action="append", default=[], metavar="NAME", help="the user (repeatable for --list)")
    p.add_argument("--mechanism", choices=MECHANISMS, help="SCRAM-SHA-256 or SCRAM-SHA-512")
    p.add_argument("--password", help="the password (visible to other local users in the process list; "
                                      "--password-file is safer)")
    p.add_argument("--password-file", metavar="FILE", help="a file whose first line is the password")
    p.add_argument("--iterations", type=int, default=4096, help="SCRAM iterations, 4096..16384 (default 4096)")


def _mechanism(name: str):  # type: ignore[no-untyped-def]
    from confluent_kafka.admin import ScramMechanism

    return ScramMechanism.SCRAM_SHA_256 if name == "SCRAM-SHA-256" else ScramMechanism.SCRAM_SHA_512


def _mechanism_name(m: object) -> str:
    return getattr(m, "name", str(m)).replace("_", "-")


def _password(args: argparse.Namespace) -> str:
    if args.password is not None and args.password_file is not None:
        raise CliError("give --password or --password-file, not both")
    if args.password_file is not None:
        try:
            lines = Path(args.password_file).read_text().splitlines()
        except OSError as e:
            raise CliError(f"cannot read {args.password_file}: {e.strerror or e}") from None
        password = lines[0] if lines else ""
    else:
        password = args.password or ""
    if not password:
        raise CliError("--add needs --password or --password-file")
    return password


def _one_user(args: argparse.Namespace) -> str:
    if len(args.user) != 1 or not args.user[0]:
        raise CliError("give one --user")
    return args.user[0]


def _add(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import ScramCredentialInfo, UserScramCredentialUpsertion

    user = _one_user(args)
    if args.mechanism is None:
        raise CliError("--add needs --mechanism (SCRAM-SHA-256 or SCRAM-SHA-512)")
    password = _password(args)
    admin = admin_client(args)
    change = UserScramCredentialUpsertion(user, ScramCredentialInfo(_mechanism(args.mechanism), args.iterations),
                                          password.encode())
    admin.alter_user_scram_credentials([change], request_timeout=timeout_s(args))[user].result(timeout_s(args))
    _done(args, "added", user, [args.mechanism])
    return 0


def _delete(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import UserScramCredentialDeletion

    user = _one_user(args)
    admin = admin_client(args)
    t = timeout_s(args)
    if args.mechanism is not None:
        mechanisms = [args.mechanism]
    else:
        described = admin.describe_user_scram_credentials([user], request_timeout=t)[user].result(t)
        mechanisms = [_mechanism_name(i.mechanism) for i in described.scram_credential_infos]
    deletions = [UserScramCredentialDeletion(user, _mechanism(m)) for m in mechanisms]
    admin.alter_user_scram_credentials(deletions, request_timeout=t)[user].result(t)
    _done(args, "deleted", user, mechanisms)
    return 0


def _done(args: argparse.Namespace, what: str, user: str, mechanisms: list[str]) -> None:
    if args.output == "json":
        print(json.dumps({"user": user, what: mechanisms}))
    else:
        print(f"Completed: {what} {', '.join(mechanisms)} credential(s) of user {user}.")


def _list(args: argparse.Namespace) -> int:
    admin = admin_client(args)
    t = timeout_s(args)
    if args.user:
        futures = admin.describe_user_scram_credentials(list(dict.fromkeys(args.user)), request_timeout=t)
        described = {u: f.result(t) for u, f in futures.items()}
    else:
        described = admin.describe_user_scram_credentials(request_timeout=t).result(t)
    rows = [(u, _mechanism_name(i.mechanism), i.iterations)
            for u, d in sorted(described.items()) for i in d.scram_credential_infos]
    emit(args, ["USER", "MECHANISM", "ITERATIONS"], rows)
    return 0


@command("users", "add, list and delete SCRAM users (kafka-configs --entity-type users)")(_configure)
def run(args: argparse.Namespace) -> int:
    return tool_main("users", lambda: _add(args) if args.add else _delete(args) if args.delete else _list(args))
