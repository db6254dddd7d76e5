"""Regenerate the tables of docs/CONFIGURATION.md and docs/COMPATIBILITY.md.

``python -m shoal.docs_gen`` rewrites the part of each file between the markers
``<!-- generated -->`` and ``<!-- end generated -->`` from the code's own tables (the
config definitions and the dispatch table); ``--check`` exits 1 if a file is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

START = "<!-- generated -->"
END = "<!-- end generated -->"
DOCS = Path(__file__).resolve().parent.parent / "docs"


def generated() -> dict[str, str]:
    from .config import render_markdown as config_tables
    from .server.dispatch import render_markdown as api_table

    return {"CONFIGURATION.md": config_tables(), "COMPATIBILITY.md": api_table()}


def splice(text: str, table: str) -> str:
    head, sep1, rest = text.partition(START)
    _, sep2, tail = rest.partition(END)
    if not (sep1 and sep2):
        raise ValueError("generated-section markers missing")
    return f"{head}{START}\n{table.strip()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, table in generated().items():
        path = DOCS / name
        text = path.read_text()
        new = splice(text, table)
        if new != text:
            stale.append(name)
            if not check:
                path.write_text(new)
    if check and stale:
        print("stale: " + ", ".join(stale) + " (run python -m shoal.docs_gen)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
