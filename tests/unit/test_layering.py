"""The architecture's import rules, checked on the source (docs/ARCHITECTURE.md, "Layers and the rules between them").

Pure modules take time as an argument and do no I/O: they never import asyncio,
socket, threading, selectors or time, and never import the server. Client-side
packages (client, admin, spark) never import the broker's internals.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "shoal"

PURE = [
    "protocol",
    "coordinator",
    "transactions",
    "groups",
    "share",
    "log/index.py",
    "log/policy.py",
    "log/producer_state.py",
    "config.py",
    "errors.py",
    "server/fetch_session.py",
    "cluster/partition_state.py",
    "cluster/placement.py",
    "cluster/leader_epochs.py",
    "cluster/replication.py",
    "cluster/metadata.py",
    "security/quotas.py",
    "security/acls.py",
]
FORBIDDEN_IN_PURE = {"asyncio", "socket", "threading", "selectors", "time", "shoal.server", "uvloop"}
CLIENT_SIDE = ["client", "admin", "spark"]
FORBIDDEN_IN_CLIENT = {"shoal.server", "shoal.log", "shoal.groups", "shoal.share", "shoal.coordinator"}


def _files(parts: list[str]) -> list[Path]:
    out: list[Path] = []
    for part in parts:
        p = ROOT / part
        if p.is_dir():
            out += sorted(p.rglob("*.py"))
        elif p.exists():
            out.append(p)
    return out


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names.add(mod)
    return names


def _violations(files: list[Path], forbidden: set[str]) -> list[str]:
    bad = []
    for f in files:
        for name in _imports(f):
            if any(name == x or name.startswith(x + ".") for x in forbidden):
                bad.append(f"{f.relative_to(ROOT.parent)} imports {name}")
    return bad


def test_pure_modules_do_no_io() -> None:
    files = _files(PURE)
    assert len(files) > 10
    assert _violations(files, FORBIDDEN_IN_PURE) == []


def test_client_side_does_not_import_broker_internals() -> None:
    assert _violations(_files(CLIENT_SIDE), FORBIDDEN_IN_CLIENT) == []


def test_observe_reads_the_broker_without_importing_its_internals() -> None:
    """shoal/observe works on the objects the server hands it; the server imports it, not
    the other way round, and it never reaches into the pure cores' internals."""
    forbidden = {"shoal.server", "shoal.cli", "shoal.log", "shoal.groups", "shoal.share", "shoal.cluster"}
    files = _files(["observe"])
    assert files
    assert _violations(files, forbidden) == []


def test_the_checker_sees_forbidden_imports(tmp_path: Path) -> None:
    fake = ROOT / "protocol" / "framing.py"
    names = _imports(fake)
    assert "shoal.errors" in names  # relative imports are resolved
    src = tmp_path / "x.py"
    src.write_text("import asyncio\nfrom time import monotonic\n")
    assert {"asyncio", "time"} <= _imports_of_text(src)


def _imports_of_text(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.add(node.module or "")
    return out
