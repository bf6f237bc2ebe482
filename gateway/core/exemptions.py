"""``ExemptPaths``: which request paths skip admission (health checks, metrics, admin).

Shared by the ASGI and the WSGI middleware, so that both exempt exactly the same paths.
"""

from __future__ import annotations

from collections.abc import Iterable

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
