"""What the facade checks of plugins before it trusts them: hook names, offers and
classifier answers. Each check returns the problem as a sentence for the user (the
caller names the plugin and its distribution), or None when there is none.
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable, Iterable
from typing import Any, Final

from gateway import hookspecs
from gateway.core.tickets import MAX_TENANT_CHARS, PRIORITIES, Ticket, ticket
from gateway.errors import PluginError
from gateway.faults import PASSED_ON
from gateway.protocols import Classification
from gateway.settings import Settings

#: the name under which plugins register and entry points are grouped
ENTRY_POINT_GROUP: Final = "obleth"
#: the attribute ``@hookimpl`` sets on a function: its options
MARK: Final = f"{ENTRY_POINT_GROUP}_impl"
#: what a provider, policy or scorer may be called: lower-case kebab-case
NAME: Final = re.compile(r"^[a-z0-9]+(?:[-.][a-z0-9]+)*$")
_HOOK_LIST: Final = ", ".join(hookspecs.HOOK_NAMES)


def hook_problems(plugin: object) -> list[str]:
    """What pluggy would silently pass over in ``plugin``, or call in a way Obleth does
    not: a misspelled hook (or ``specname``), a hook function without the marker, a
    wrapper.

    A marked function implements the hook its ``specname`` names, else the one its own
    name does; an unmarked one is looked at only when its name starts with ``obleth_``.
    """
    known = set(hookspecs.HOOK_NAMES)
    problems = []
    for attr in dir(plugin):
        function = getattr(plugin, attr, None)
        if not inspect.isroutine(function):
            continue
        options = getattr(function, MARK, None)
        if not isinstance(options, dict):
            problem = unmarked_problem(attr, known)
        else:
            problem = marked_problem(attr, options, known)
        if problem is not None:
            problems.append(problem)
    return problems


def unmarked_problem(attr: str, known: set[str]) -> str | None:
    """The problem of a function ``attr`` of a plugin, without the ``@hookimpl`` marker."""
    if not attr.startswith("obleth_"):
        return None
    if attr not in known:
        return _no_hook(repr(attr), attr, known)
    return (
        f"defines {attr!r} without the @hookimpl marker, so it would never be called; "
        "mark it (from gateway import hookimpl)"
    )


def marked_problem(attr: str, options: dict[str, Any], known: set[str]) -> str | None:
    """The problem of a function ``attr`` marked with ``@hookimpl(**options)``."""
    hook = options.get("specname") or attr
    what = f"{attr!r}" if hook == attr else f"{attr!r} (specname {hook!r})"
    if hook not in known:
        return _no_hook(what, hook, known)
    if options.get("hookwrapper") or options.get("wrapper"):
        return (
            f"marks {what} as a hook wrapper, which Obleth does not call; "
            "use tryfirst=True or trylast=True to order it instead"
        )
    return None


def _no_hook(what: str, hook: str, known: set[str]) -> str:
    """The problem of a function that implements ``hook``, which is not in ``known``."""
    close = difflib.get_close_matches(hook, sorted(known), n=1)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    return f"implements {what}, which is no Obleth hook{guess}; hooks are: {_HOOK_LIST}"


def unusable(answer: object) -> str | None:
    """What makes a classifier's answer unusable, said for the log; None when it is usable."""
    if not isinstance(answer, Classification):
        return f"{answer!r}, not a Classification"
    tenant, priority, routing_key, session_id = answer
    problem = _unusable_class(answer, tenant, priority)
    if problem is not None:
        return problem
    if routing_key is not None and not isinstance(routing_key, bytes):
        return f"{answer!r}: routing_key must be bytes or None"
    if session_id is not None and not isinstance(session_id, str):
        return f"{answer!r}: session_id must be a str or None"
    return None


def unusable_ticket(answer: object) -> str | None:
    """What makes the answer of a classifier's header-only path (``HEADER_TICKETS``)
    unusable, as ``unusable`` says of the hook's; a ticket holds one seat: a classifier
    names a class, not a cost."""
    if not isinstance(answer, Ticket):
        return f"{answer!r}, not a Ticket"
    tenant, priority, seats, tokens = answer
    problem = _unusable_class(answer, tenant, priority)
    if problem is None and (type(seats) is not int or seats != 1 or tokens != 0):
        return f"{answer!r}: a classifier's ticket holds 1 seat and no tokens"
    return problem


#: a classifier's header-only path: the ticket of the request with these raw ASGI headers
HeaderTicket = Callable[[Iterable[tuple[bytes, bytes]]], Ticket]


def header_tickets(
    offer: Callable[[Settings], Any],
    settings: Settings,
    plugin: str,
    distribution: str,
    complain: Callable[[str], None] | None,
) -> HeaderTicket:
    """The header-only path that ``offer`` (a classifier's ``HEADER_TICKETS``) builds from
    ``settings``; a ``PluginError`` naming ``plugin`` when it cannot. With ``complain``
    (a third party's path), its answers are checked: see ``CheckedTickets``."""
    try:
        tickets: HeaderTicket = offer(settings).ticket
    except PASSED_ON:
        raise
    except BaseException as exc:  # SystemExit too: a plugin's, not a way to stop
        raise PluginError(
            plugin,
            f"its {hookspecs.HEADER_TICKETS} (the classifier's header-only path) could not be "
            f"built from the settings: {exc!r}; fix it, or disable the plugin",
            distribution=distribution,
        ) from exc
    if complain is None:
        return tickets
    default = ticket(settings.default_tenant, settings.default_priority)
    return CheckedTickets(tickets, default, complain)


class CheckedTickets:
    """A third-party classifier's header-only path, its answers checked as the hook's
    are: an unusable one is told to ``complain`` (which names the plugin) and the
    request goes on with ``default``, never a 500 nor a ticket past the limit."""

    __slots__ = ("_complain", "_default", "_tickets")

    def __init__(
        self,
        tickets: Callable[[Iterable[tuple[bytes, bytes]]], Ticket],
        default: Ticket,
        complain: Callable[[str], None],
    ) -> None:
        self._tickets = tickets
        self._default = default
        self._complain = complain

    def __call__(self, headers: Iterable[tuple[bytes, bytes]]) -> Ticket:
        answer = self._tickets(headers)
        problem = unusable_ticket(answer)
        if problem is None:
            return answer
        self._complain(f"returned {problem}")
        return self._default


def _unusable_class(answer: object, tenant: object, priority: object) -> str | None:
    if not isinstance(tenant, str) or not tenant:
        return f"{answer!r}: the tenant must be a non-empty str"
    if len(tenant) > MAX_TENANT_CHARS:  # its repr would flood the log
        return f"a tenant of {len(tenant)} characters; at most {MAX_TENANT_CHARS} are taken"
    if not tenant.isprintable():
        return f"{answer!r}: the tenant must be printable (no control characters)"
    if priority not in PRIORITIES:
        return f"{answer!r}: the priority must be one of {', '.join(PRIORITIES)}"
    return None


def load_problem(
    name: str, target: str, origin: tuple[str, str], error: BaseException
) -> PluginError:
    """The error of entry point ``name`` (``target``, from distribution ``origin``) whose
    import raised ``error``."""
    problem = PluginError(
        name,
        f"failed to load {target!r}: {type(error).__name__}: {error}. Fix or uninstall "
        f"{origin[0]}, or skip it with OBLETH_DISABLE_PLUGINS={name}",
        distribution=dist_label(origin),
    )
    problem.__cause__ = error
    return problem


def dist_label(origin: tuple[str, str]) -> str:
    """``name version``; empty for plugins the application registered in code."""
    distribution, version = origin
    return f"{distribution} {version}".strip()
