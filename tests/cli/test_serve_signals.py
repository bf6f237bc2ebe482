"""How ``obleth serve``'s servers end on SIGINT and SIGTERM (``gateway.server.running``),
in a real process: gracefully, with status 0 whichever signal came, and a stream that
outlasts the graceful shutdown is cut off with one warning, not a traceback."""

from __future__ import annotations

import asyncio
import http.client
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import uvicorn

from gateway.server.running import CUT_OFF, _CutOff
from tests.cluster.pods import HOST, free_port

HERE = Path(__file__).parent
WAIT_S = 20.0


def started(port: int, *more: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, str(HERE / "signalled.py"), str(port), *map(str, more)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=HERE.parent.parent,
    )
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            connection = http.client.HTTPConnection(HOST, port, timeout=2)
            connection.request("GET", "/")
            if connection.getresponse().read() == b"ready":
                connection.close()
                return process
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"did not start: {process.communicate()}")
        time.sleep(0.05)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_serving_with_status_0_and_a_cut_stream_is_one_warning(
    stop: signal.Signals,
) -> None:
    port = free_port()
    process = started(port)
    stream = http.client.HTTPConnection(HOST, port, timeout=WAIT_S)
    try:
        stream.request("GET", "/stream")
        answer = stream.getresponse()
        assert answer.read1(64).startswith(b"token")

        process.send_signal(stop)
        _, err = process.communicate(timeout=WAIT_S)

        assert process.returncode == 0, err
        assert CUT_OFF in err, err
        assert "Traceback" not in err and "CancelledError" not in err, err
        with pytest.raises(http.client.IncompleteRead):
            answer.read()  # the stream was cut, not finished
    finally:
        stream.close()
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_a_signal_stops_every_server_of_the_process_at_once() -> None:
    """The gateway and the admin API are two servers in one process. Each used to install
    its own signal handler, so the last one took SIGTERM alone and the other went on
    serving until it had drained: both now start their graceful shutdown on the signal,
    before either cuts its streams off."""
    ports = [free_port(), free_port()]
    process = started(*ports)
    streams = [http.client.HTTPConnection(HOST, port, timeout=WAIT_S) for port in ports]
    try:
        for stream in streams:
            stream.request("GET", "/stream")
            assert stream.getresponse().read1(64).startswith(b"token")
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=WAIT_S)
    finally:
        for stream in streams:
            stream.close()
        if process.poll() is None:
            process.kill()
            process.communicate()

    assert process.returncode == 0, err
    lines = err.splitlines()
    stopping = [i for i, line in enumerate(lines) if "Shutting down" in line]
    cut = [i for i, line in enumerate(lines) if CUT_OFF in line]
    assert len(stopping) == 2 and len(cut) == 2, err
    assert max(stopping) < min(cut), err


def test_a_cancelled_request_while_serving_goes_on_being_logged_as_an_error() -> None:
    """The warning is for requests the graceful shutdown cut off: a ``CancelledError`` out
    of an app while the server is not stopping (an app's own bug) keeps its traceback."""
    server = uvicorn.Server(uvicorn.Config(lambda scope, receive, send: None))
    cut_off = _CutOff([server])

    def record() -> logging.LogRecord:
        try:
            raise asyncio.CancelledError
        except asyncio.CancelledError:
            error = sys.exc_info()
        return logging.LogRecord(
            "uvicorn.error", logging.ERROR, __file__, 1, "Exception in ASGI application", (), error
        )

    serving = record()
    assert cut_off.filter(serving)
    assert serving.levelno == logging.ERROR and serving.exc_info is not None

    server.should_exit = True
    stopping = record()
    assert cut_off.filter(stopping)
    assert stopping.levelno == logging.WARNING and stopping.getMessage() == CUT_OFF
    assert stopping.exc_info is None
