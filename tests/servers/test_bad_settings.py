"""A bad setting stops every server before it serves, and its output names the setting and
what would be accepted: on one line, without a traceback, when the gateway is built while
the server runs (``lifespan.startup.failed``); at the end of the server's import traceback
when it is built at import (docs/servers.md has what each server prints)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import GatewayMiddleware, OblethError
from gateway.types import Receive, Scope, Send
from tests.servers.servers import APP, BUILT_AT_IMPORT, Server, Stage

STARTUP_FAILED = {"uvicorn": {3}, "hypercorn-w0": {3}, "granian": {1}, "gunicorn": {1, 3}}
"""Each server's exit status when the app fails to start. hypercorn with worker processes
(its default) exits 0 whatever its worker did: its status is not checked. gunicorn's is 1
when its master trips over a second worker failing while it stops (see ``HALT``)."""
IMPORT_FAILED = {"uvicorn": {1}, "hypercorn-w0": {1}, "granian": {1}, "gunicorn": {1, 3}}
"""Each server's exit status when importing the app raises."""

HALT = "gunicorn.errors.HaltServer: <HaltServer 'Worker failed to boot.' 3>"
"""How gunicorn's own traceback ends when two workers fail to boot at about the same time:
its master, stopping because of the first, raises again for the second (docs/servers.md)."""

SERVERS = ["uvicorn", "hypercorn", "hypercorn-w0", "granian", "gunicorn"]


async def _never_called(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("never called: building the gateway fails first")


def message_of(settings: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """The error ``GatewayMiddleware`` raises with ``settings`` in the environment."""
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(OblethError) as caught:
        GatewayMiddleware(_never_called)
    return str(caught.value)


def raised(output: str) -> list[str]:
    """The last line of each traceback in ``output``: the exception it reports."""
    lines = output.splitlines()
    found = []
    for i, line in enumerate(lines):
        if line == "Traceback (most recent call last):":
            unindented = (x for x in lines[i + 1 :] if not x[:1].isspace())
            found.append(next(unindented, ""))
    return found


def run_to_exit(server_name: str, target: str, settings: dict[str, str], root: Path) -> Server:
    server = Server(server_name, Stage(root), settings, target=target)
    server.start()
    try:
        server.exit_status()
    finally:
        server.stop()
    return server


@pytest.mark.parametrize(
    "setting",
    [{"OBLETH_GLOBAL_MAX_IN_FLIGHT": "-3"}, {"OBLETH_OVERFLOW_POLICY": "nope"}],
    ids=["max-in-flight", "overflow-policy"],
)
@pytest.mark.parametrize("server_name", SERVERS)
def test_a_bad_setting_stops_the_server_at_startup_with_one_line_and_no_traceback(
    server_name: str, setting: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway built on the server's first event: the server exits before serving,
    with a failed-startup status, and prints the error whole on a line of its own (after
    the server's own prefix, if any), and no traceback."""
    message = message_of(setting, monkeypatch)
    server = run_to_exit(server_name, APP, setting, tmp_path)

    output = server.output()
    assert [line for line in output.splitlines() if line.endswith(message)], output
    assert set(raised(output)) <= ({HALT} if server_name == "gunicorn" else set()), output
    if server_name in STARTUP_FAILED:
        assert server.exit_status() in STARTUP_FAILED[server_name], output


@pytest.mark.parametrize("server_name", SERVERS)
def test_a_bad_setting_stops_the_server_when_the_gateway_is_built_at_import(
    server_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway built at import: the server exits before serving, with a non-zero
    status, and the last line of its import traceback is the error, whole."""
    setting = {"OBLETH_OVERFLOW_POLICY": "nope"}
    message = message_of(setting, monkeypatch)
    server = run_to_exit(server_name, BUILT_AT_IMPORT, setting, tmp_path)

    output = server.output()
    assert f"gateway.errors.ConfigError: {message}" in output.splitlines(), output
    if server_name in IMPORT_FAILED:
        assert server.exit_status() in IMPORT_FAILED[server_name], output
