"""``obleth capacity get|set N``: read or change a running gateway's limit through its
admin API (``/api/v1/capacity``), from a shell or a deployment script."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import httpx

from gateway.admin.contract import ADMIN_PORT, CAPACITY_PATH
from gateway.cli.defaults import DefaultsShown
from gateway.errors import without_userinfo
from gateway.settings import ENV_PREFIX

#: where the admin API listens unless told otherwise (``obleth serve --admin-port``)
DEFAULT_URL = f"http://127.0.0.1:{ADMIN_PORT}"
#: the admin token's variable, as the gateway reads it
TOKEN_VARIABLE = ENV_PREFIX + "ADMIN_TOKEN"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "capacity",
        help="read or change a running gateway's limit on requests in flight",
        description="Read (get) or change (set N) the limit of a running gateway through its "
        f"admin API. The token is --token or ${TOKEN_VARIABLE}. set N sets the operator's "
        "limit, the ceiling; both print the limit in force, which a computed capacity "
        "provider (kv-pressure, adaptive) may hold below the ceiling. In cluster mode any "
        "pod changes the ceiling of the whole pool. 0 pauses admissions.",
        formatter_class=DefaultsShown,
    )
    parser.add_argument("action", choices=["get", "set"], help="get the limit, or set it")
    parser.add_argument("limit", nargs="?", type=int, help="the new limit, for set")
    parser.add_argument("--url", default=DEFAULT_URL, help="the admin API")
    parser.add_argument("--token", help=f"the admin token (default: ${TOKEN_VARIABLE})")
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=10.0,
        help="seconds to wait for it, above 0 and at most a day (86400)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Prints the limit in force on stdout, for ``set`` too (what ``get`` prints from then
    on); when ``set`` leaves it below the ceiling it set (a computed capacity provider is
    lower), one line on stderr says so. A failure is one line on stderr and exit status 1
    (2 for a command line that cannot work)."""
    if args.action == "set" and args.limit is None:
        return _fail("set needs the new limit: obleth capacity set N", status=2)
    if args.action == "get" and args.limit is not None:
        return _fail("get takes no limit: obleth capacity get", status=2)
    # as the gateway reads it: a Secret mounted from a file ends with a newline, which
    # is no part of the token (and no header may carry it)
    given = args.token if args.token is not None else os.environ.get(TOKEN_VARIABLE)
    token = (given or "").strip()
    if not token:
        if args.token is not None:  # given, and blank: not a reason to use the variable
            return _fail("--token is blank: pass the admin token itself", status=2)
        return _fail(f"no admin token: pass --token or set {TOKEN_VARIABLE}", status=2)
    if not token.isascii() or not token.isprintable():
        return _fail(
            f"the admin token (--token or {TOKEN_VARIABLE}) must be printable ASCII: an HTTP "
            "header carries it",
            status=2,
        )
    shown = without_userinfo(args.url)
    if shown != args.url:
        # httpx would send them as Basic credentials in place of the bearer token
        return _fail(
            f"--url {shown!r}: expected no user or password in it; the admin token goes in "
            f"--token or {TOKEN_VARIABLE}",
            status=2,
        )
    try:
        base = httpx.URL(args.url)
    except httpx.InvalidURL as exc:
        return _fail(f"--url {args.url!r}: {exc}; expected e.g. {DEFAULT_URL}", status=2)
    if base.scheme not in ("http", "https") or not base.host:
        return _fail(f"--url {args.url!r}: expected an http(s) URL, e.g. {DEFAULT_URL}", status=2)
    # "?" or "#" alone is an empty query or fragment, which httpx reads as none
    if (
        base.query
        or base.fragment
        or any(mark in args.url for mark in "?#")
        or (base.port is not None and not 1 <= base.port <= 65535)
    ):
        # the API's path goes after the URL: a query would swallow it
        return _fail(
            f"--url {args.url!r}: expected the admin API's base URL, with a port from 1 to "
            f"65535 and no query or fragment, e.g. {DEFAULT_URL}",
            status=2,
        )
    url = args.url.rstrip("/") + CAPACITY_PATH
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(timeout=args.timeout, trust_env=False) as client:
            if args.action == "get":
                answer = client.get(url, headers=headers)
            else:
                answer = client.put(url, headers=headers, json={"max_in_flight": args.limit})
    except httpx.HTTPError as exc:
        return _fail(f"{url}: {type(exc).__name__}: {exc or 'no answer'}")
    document = _json(answer)
    if answer.status_code != 200:
        message = _error_message(document) or answer.reason_phrase
        return _fail(f"{url}: {answer.status_code} {message}")
    limit = document.get("max_in_flight") if isinstance(document, dict) else None
    if not isinstance(limit, int) or isinstance(limit, bool):  # JSON true is no limit
        return _fail(f"{url}: the answer holds no max_in_flight; is this an Obleth admin API?")
    print(limit)
    ceiling = document.get("ceiling")
    if isinstance(ceiling, int) and not isinstance(ceiling, bool) and ceiling != limit:
        print(
            f"obleth capacity: the ceiling is now {ceiling}; the limit in force is {limit}, "
            "the lowest of the capacity providers (GET /api/v1/status shows each)",
            file=sys.stderr,
        )
    return 0


def _json(answer: httpx.Response) -> Any:
    try:
        return answer.json()
    except ValueError:
        return None


def _error_message(document: Any) -> str | None:
    if isinstance(document, dict) and isinstance(document.get("error"), dict):
        message = document["error"].get("message")
        return message if isinstance(message, str) else None
    return None


def _fail(message: str, *, status: int = 1) -> int:
    print(f"obleth capacity: {message}", file=sys.stderr)
    return status


MAX_TIMEOUT_S = 86_400.0
"""The longest ``--timeout``: a day, far beyond any answer worth waiting for (sockets
refuse timeouts past what the platform's clock can hold)."""


def seconds(text: str) -> float:
    """``--timeout``: seconds above 0, at most ``MAX_TIMEOUT_S`` (argparse names the flag)."""
    value = float(text)
    if not 0 < value <= MAX_TIMEOUT_S:
        raise ValueError(text)
    return value
