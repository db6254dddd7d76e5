"""The table of served APIs: api_key -> (handler, min_version, max_version).

Handler modules register with the ``@api`` decorator; ``routes()`` imports every module
of ``shoal.server.handlers`` and returns the table. A subsystem that needs start-up
work (a coordinator replaying its topic) registers ``broker.on_start`` hooks from the
modules its handlers import, so adding an API never means editing a central list. ApiVersions answers from this table, and docs/COMPATIBILITY.md is
generated from it (``python -m shoal.server.dispatch``), so the broker advertises
exactly what it serves. A version range is clamped to what kio has, and registering
one API twice is an error.

A handler is ``handler(ctx, request) -> response`` or an ``async def`` of the same
shape; it returns the kio response entity for ``ctx.codec``'s version, or raises
ApiError for a request-level error the handler chose not to encode itself.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..protocol.codec import codec_for

__all__ = ["Route", "api", "routes"]


@dataclass(frozen=True, slots=True)
class Route:
    api_key: int
    handler: Callable[..., Any]
    min_version: int
    max_version: int


_REGISTRY: dict[int, Route] = {}



def api(api_key: int, min_version: int, max_version: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if api_key in _REGISTRY:
            raise RuntimeError(f"API {api_key} registered twice")
        lo, hi = min_version, max_version
        while lo <= hi and codec_for(api_key, lo) is None:
            lo += 1
        while hi >= lo and codec_for(api_key, hi) is None:
            hi -= 1
        if lo > hi:
            raise RuntimeError(f"kio has no version of API {api_key} in {min_version}..{max_version}")
        _REGISTRY[api_key] = Route(api_key, fn, lo, hi)
        return fn

    return register


_loaded = False


def routes() -> dict[int, Route]:
    global _loaded
    if not _loaded:
        from . import handlers

        for info in pkgutil.iter_modules(handlers.__path__):
            importlib.import_module(f"{handlers.__name__}.{info.name}")
        _loaded = True
    return _REGISTRY


def render_markdown() -> str:
    from kio.schema.index import api_key_map

    lines = ["| API | key | versions served |", "|---|---|---|"]
    for key, r in sorted(routes().items()):
        name = "".join(p.capitalize() for p in api_key_map[key].split("_"))
        lines.append(f"| {name} | {key} | {r.min_version}-{r.max_version} |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(render_markdown())
