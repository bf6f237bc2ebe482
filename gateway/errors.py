"""Obleth's exceptions, one hierarchy.

::

    OblethError                    anything Obleth raises on purpose
    ├── ConfigError                a setting is wrong: stops startup, names the setting
    ├── PluginError                a plugin failed to load or returned garbage: names it
    ├── BadRequest                 a request Obleth cannot classify: answered 400
    ├── Disconnected               the client went away while its request waited
    ├── Rejected                   a request was not admitted; carries the HTTP answer
    └── Unroutable                 an admitted request has no upstream to go to (404/503)

Every message says what happened, which setting, input or plugin caused it, and what
to do about it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gateway.core.reasons import TENANT_REASONS, RejectReason

__all__ = [
    "BadRequest",
    "ConfigError",
    "Disconnected",
    "OblethError",
    "PluginError",
    "RejectReason",
    "Rejected",
    "Unroutable",
]


class OblethError(Exception):
    """Base class of every error Obleth raises on purpose.

    Every one survives ``pickle`` and ``copy`` with its message and attributes (an error
    raised in a worker process reaches its parent whole), though most take constructor
    arguments other than their message."""

    def __reduce__(self) -> tuple[object, ...]:
        # the attributes go as the state pickle sets afterwards: they may refer back to
        # the error itself (``PluginError.problems``)
        return _rebuilt, (type(self), self.args), self.__dict__


class ConfigError(OblethError, ValueError):
    """A setting has a value Obleth cannot use; raised at startup, never per request."""

    def __init__(self, setting: str, value: object, expected: str) -> None:
        self.setting = setting
        self.value = value
        self.expected = expected
        super().__init__(f"{setting}={_shown(value)}: {expected}")


class PluginError(OblethError):
    """A plugin could not be loaded, or gave Obleth something it cannot use."""

    def __init__(self, plugin: str, problem: str, *, distribution: str | None = None) -> None:
        self.plugin = plugin
        self.distribution = distribution
        #: every problem found at once when several were (see ``together``): an operator
        #: fixes them all before the next restart, not one per restart
        self.problems: tuple[PluginError, ...] = (self,)
        origin = f"plugin {plugin!r}"
        if distribution:
            origin += f" (from distribution {distribution})"
        super().__init__(f"{origin}: {problem}")

    @classmethod
    def together(cls, problems: Sequence[PluginError]) -> PluginError:
        """One error for ``problems`` (at least one): the problem itself when alone, else
        an error that lists each on a line of its own. ``plugin`` and ``distribution``
        are the first problem's; ``problems`` holds them all."""
        if len(problems) == 1:
            return problems[0]
        first = problems[0]
        error = cls(first.plugin, "", distribution=first.distribution)
        lines = "\n".join(f"  {problem}" for problem in problems)
        error.args = (f"{len(problems)} problems with plugins, each to be fixed:\n{lines}",)
        error.problems = tuple(problems)
        return error


class BadRequest(OblethError):
    """A request Obleth cannot classify (a bad priority header, a body over the bound)."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        close: bool = False,
        code: str | None = None,
    ) -> None:
        self.param = param
        self.status = status
        #: the error body's ``code``, for a refusal a client may want to tell apart
        self.code = code
        #: whether the answer must close the connection: the body was left unread
        self.close = close
        super().__init__(message)


class Disconnected(OblethError):
    """The client went away while its request waited; nobody is left to answer.

    ``timed_out``: not gone, but too slow with its body (``BodyTimeout`` answers it 408).
    """

    def __init__(self, *args: object, timed_out: bool = False) -> None:
        super().__init__(*args)
        self.timed_out = timed_out


_REJECT_MESSAGES: dict[str, str] = {
    "queue_full": "the gateway's queue is full; retry later",
    "over_capacity": "no seat is free and the overflow policy does not queue; retry later",
    "no_wait": "no seat is free and background requests do not wait; retry later",
    "tenant_limit": "this tenant has as many requests in flight as it may; retry later",
    "requests_per_minute": "this tenant has used its requests for this minute; retry later",
    "tokens_per_minute": "this tenant has used its tokens for this minute; retry later",
    "evicted": "this request was dropped from the queue to make room; retry later",
    "queue_timeout": "no seat became free in time; retry later",
    "unavailable": (
        "the gateway is not admitting requests (it is stopping, or cannot reach its shared "
        "budget in Redis); retry later"
    ),
}


class Rejected(OblethError):
    """The gateway did not admit a request; the middleware turns this into a 503 or 429."""

    def __init__(self, reason: RejectReason, message: str, *, retry_after_s: float = 1.0) -> None:
        self.reason = reason
        self.retry_after_s = retry_after_s
        super().__init__(message)

    @classmethod
    def because(cls, reason: RejectReason, *, retry_after_s: float) -> Rejected:
        """The rejection for ``reason`` with its standard message, whoever decided it."""
        return cls(reason, _REJECT_MESSAGES[reason], retry_after_s=retry_after_s)

    @property
    def status(self) -> int:
        """429 when the tenant is over its own cap or rate, 503 when the service is full."""
        return 429 if self.reason in TENANT_REASONS else 503


class Unroutable(OblethError):
    """No configured upstream can take an admitted request.

    ``status`` 404 with ``code`` ``model_not_found`` when no upstream serves the model the
    request names; 503 ``no_healthy_upstream`` when every upstream that serves it fails its
    health checks. ``param`` names the request's field at fault (``model``), as the error
    body's ``param`` does.
    """

    def __init__(self, message: str, *, status: int, code: str, param: str | None = None) -> None:
        self.status = status
        self.code = code
        self.param = param
        super().__init__(message)


def _rebuilt(kind: type[OblethError], args: tuple[object, ...]) -> OblethError:
    """An error of ``kind`` with ``args``, built without its ``__init__`` (for ``pickle``
    and ``copy``, which then restore its attributes)."""
    error = kind.__new__(kind, *args)
    error.args = args
    return error


def _shown(value: object, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters: a message names the value, it need
    not reprint a huge one (nor fail on an int too long to print)."""
    try:
        text = repr(value)
    except ValueError:
        return f"<{type(value).__name__} too long to print>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def without_userinfo(url: str) -> str:
    """``url`` with a ``user:password@`` before its host replaced by ``***@``, whether or
    not the rest of it is a URL that parses: what a message may show of a URL given as
    a setting or a flag, which must never print a password."""
    return _USERINFO.sub(lambda found: (found.group(1) or "") + "***@", url, count=1)


#: a scheme, if any, then up to the last "@" before any "/", "?" or "#": the userinfo (a
#: password may hold an "@" of its own)
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)?[^/?#]*@")
