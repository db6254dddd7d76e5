from __future__ import annotations

from shoal.docs_gen import DOCS, END, START, generated, splice


def test_generated_tables_in_docs_are_current() -> None:
    for name, table in generated().items():
        text = (DOCS / name).read_text()
        assert START in text and END in text
        assert splice(text, table) == text, f"docs/{name} is stale: run python -m shoal.docs_gen"


def test_every_served_api_is_in_compatibility_doc() -> None:
    from shoal.server.dispatch import routes

    text = (DOCS / "COMPATIBILITY.md").read_text()
    for key, route in routes().items():
        assert f"| {key} | {route.min_version}-{route.max_version} |" in text
