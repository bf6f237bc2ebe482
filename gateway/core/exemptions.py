"""``ExemptPaths``: which request paths skip admission (health checks, metrics, admin);
and ``route_path``: the path of an ASGI request below the server's ``root_path``, which
those paths, the probes and the admin API are matched against.

Shared by the ASGI and the WSGI middleware, so that both exempt exactly the same paths.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.core.memo import Memo

#: How many distinct paths are remembered before the memo starts over.
_PATHS_KEPT = 1024


class ExemptPaths:
    """``covers(path)``: whether a request for ``path`` skips admission.

    A path is exempt when it is one of ``paths`` or lies below one (``/metrics/x`` under
    ``/metrics``); never when it has a ``.`` or ``..`` segment, as the app or an upstream
    may resolve ``/healthz/../v1/completions`` to a path that is not exempt, and admission
    must not be skipped for it. Answers are remembered per path: one dictionary lookup
    per request. Safe to share between threads.
    """

    __slots__ = ("_known", "_paths", "_prefixes")

    def __init__(self, paths: Iterable[str]) -> None:
        self._paths = frozenset(paths)
        self._prefixes = tuple(path + "/" for path in self._paths if path != "/")
        self._known: Memo[str, bool] = Memo(_PATHS_KEPT)

    def covers(self, path: str) -> bool:
        exempt = self._known.get(path)
        if exempt is None:
            segments = path.split("/")
            exempt = self._known.keep(
                path,
                (path in self._paths or path.startswith(self._prefixes))
                and "." not in segments
                and ".." not in segments,
            )
        return exempt


def route_path(scope: Mapping[str, Any]) -> str:
    """The path of an ASGI request below its ``root_path``: ``/healthz`` for
    ``scope["path"] == "/gw/healthz"`` under ``uvicorn --root-path /gw`` or a Starlette
    ``Mount("/gw", ...)``, whose ``path`` includes the prefix (as the ASGI spec has it);
    the path itself when there is no ``root_path``, or the path does not start with it
    (a server that strips the prefix itself). The prefix is matched whole: ``/gwx`` is
    not below ``/gw``. The one definition for the middleware's ``exempt_paths``, the
    probes and the admin API; the middleware, on the request path, calls it only when
    ``scope.get("root_path")`` is set."""
    path: str = scope["path"]
    root = scope.get("root_path")
    if not root or not path.startswith(root):
        return path
    below = path[len(root) :]
    if not below:
        return "/"
    return below if below[0] == "/" else path
