"""The ``shoal`` command: ``serve`` runs the broker; the other subcommands are admin tools."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

__all__ = ["main"]

_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def command(name: str, help: str) -> Callable[..., Callable[[argparse.Namespace], int]]:
    def register(configure: Callable[[argparse.ArgumentParser], None]) -> Callable[..., Callable[[argparse.Namespace], int]]:
        def with_run(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
            _COMMANDS[name] = (help, configure, run)
            return run

        return with_run

    return register


def _load_commands() -> None:
    from . import serve  # noqa: F401

    for optional in ("topics", "configs", "console", "consumer_groups", "share_groups", "dev_cluster",
                     "reassign_partitions", "users", "acls", "transactions"):
        try:
            __import__(f"{__package__}.{optional}")
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{optional}":
                raise


def main(argv: Sequence[str] | None = None) -> int:
    _load_commands()
    parser = argparse.ArgumentParser(prog="shoal", description="shoal: a Kafka-compatible broker with share groups")
    subs = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, configure, run) in _COMMANDS.items():
        p = subs.add_parser(name, help=help_text, description=help_text)
        configure(p)
        p.set_defaults(_run=run)
    args = parser.parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
