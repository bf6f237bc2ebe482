"""``WSGIGatewayMiddleware`` in front of a WSGI app served by a threaded server, called over
HTTP: the limit counted at the app, rejections, queueing, seats held to the close of the
response iterable and given back exactly once however the app ends, the body replayed
byte for byte, and the record the app reads in ``environ["obleth"]``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from gateway import Classification, ConfigError, Settings, hookimpl
from gateway.wsgi import WSGIGatewayMiddleware
from tests.cluster.pods import SimBackend
from tests.wsgi.heldapp import CHAT, WAIT_S, HeldApp, gated, outcomes, post, wait_until
from tests.wsgi.serving import serving


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(8) as executor:
        yield executor


def test_the_limit_holds_at_the_app_and_a_request_past_it_gets_503_json(
    pool: ThreadPoolExecutor,
) -> None:
    app = HeldApp()
    middleware = gated(app, global_max_in_flight=2, overflow_policy="reject")
    with serving(middleware) as url:
        running = [pool.submit(post, url, headers={"x-tenant": "t"}) for _ in range(2)]
        app.wait_entered(2)
        past = post(url)
        health = httpx.get(url + "/healthz", trust_env=False)
        app.release.set()
        answers = [future.result() for future in running]
        after = post(url)
    middleware.close()

    assert past.status_code == 503 and past.headers["retry-after"] == "1"
    assert past.headers["content-type"] == "application/json"
    assert past.json()["error"]["code"] == "over_capacity"
    assert health.status_code == 200  # exempt: never admission-controlled
    assert [answer.status_code for answer in answers] == [200, 200]
    assert after.status_code == 200
    assert app.peak == 2
    assert middleware.gateway.snapshot().inflight == 0
    assert outcomes(middleware) == {"completed": 3, "rejected:over_capacity": 1}


def test_a_request_waits_for_a_seat_and_the_app_reads_its_record(
    pool: ThreadPoolExecutor,
) -> None:
    app = HeldApp()
    middleware = gated(app, global_max_in_flight=1, tenant_header="x-tenant")
    with serving(middleware) as url:
        first = pool.submit(post, url, headers={"x-tenant": "gold"})
        app.wait_entered(1)
        queued = pool.submit(post, url, headers={"x-tenant": "free", "x-priority": "critical"})
        wait_until(lambda: middleware.gateway.snapshot().queued == 1)
        assert app.now == 1
        app.release.set()
        answers = [first.result(), queued.result()]
    middleware.close()

    records = [answer.json()["record"] for answer in answers]
    assert [record["tenant"] for record in records] == ["gold", "free"]
    assert records[0]["waited_s"] == 0.0 and records[1]["waited_s"] > 0
    assert app.peak == 1


def test_a_streamed_response_holds_its_seat_until_the_server_closes_it(
    pool: ThreadPoolExecutor,
) -> None:
    app = HeldApp(stream=True)
    middleware = gated(app, global_max_in_flight=1, overflow_policy="reject")

    def stream(url: str) -> list[bytes]:
        with httpx.stream("POST", url + CHAT, json={}, trust_env=False, timeout=WAIT_S) as answer:
            return list(answer.iter_lines())

    with serving(middleware) as url:
        streaming = pool.submit(stream, url)
        app.wait_entered(1)
        during = post(url)
        app.release.set()
        lines = streaming.result()
        wait_until(lambda: middleware.gateway.snapshot().inflight == 0)
        after = pool.submit(stream, url)
        app.wait_entered(1)
        after_lines = after.result()
    middleware.close()

    assert during.status_code == 503
    assert lines[0] == "first" and json.loads(lines[1])["record"]["tenant"] == "anonymous"
    assert after_lines[0] == "first"
    assert outcomes(middleware) == {"completed": 2, "rejected:over_capacity": 1}


@pytest.mark.parametrize("where", ["call", "start", "iterate"])
def test_an_app_that_raises_gives_its_seat_back(where: str) -> None:
    """Counted as an error wherever the app raises: in its call, in ``iter()`` of its
    response (before the server sent the head) or in the middle of the stream."""
    app = HeldApp(stream=where == "iterate", fail=where)
    app.release.set()
    middleware = gated(app, global_max_in_flight=1, overflow_policy="reject")
    with serving(middleware) as url:
        # the one seat comes back each time: never a 503
        answers = [post(url) for _ in range(3)]
        wait_until(lambda: middleware.gateway.snapshot().inflight == 0)
    middleware.close()

    if where in ("call", "start"):
        assert [answer.status_code for answer in answers] == [500] * 3
    else:  # the server had sent the head: it cuts the body short
        assert [answer.text for answer in answers] == ["first\n"] * 3
    assert outcomes(middleware) == {"error": 3}


def test_the_app_reads_the_body_the_client_sent_byte_for_byte() -> None:
    """JSON is read ahead (for classifiers that take the body) and replayed; other bodies
    stream to the app untouched."""
    seen: list[bytes | None] = []

    class BodyClassifier:
        @hookimpl
        def obleth_classify_request(self, body: bytes | None) -> Classification:
            seen.append(body)
            return Classification(tenant="by-body", priority="standard")

    app = HeldApp()
    app.release.set()
    middleware = WSGIGatewayMiddleware(
        app, settings=Settings(global_max_in_flight=4), plugins=[BodyClassifier()]
    )
    raw = '{"messages": [{"role": "user", "content": "hé ☃"}]}  '.encode()
    form = b"a=1&b=" + b"x" * 100_000
    with serving(middleware) as url:
        json_answer = post(url, content=raw, headers={"content-type": "application/json"})
        form_answer = post(
            url, content=form, headers={"content-type": "application/x-www-form-urlencoded"}
        )
    middleware.close()

    assert json_answer.json()["body"].encode("latin-1") == raw
    assert json_answer.json()["record"]["tenant"] == "by-body"
    assert form_answer.json()["body"].encode("latin-1") == form
    assert seen == [raw, None]


def test_a_json_body_over_the_bound_is_refused_413_before_the_app() -> None:
    class BodyClassifier:
        @hookimpl
        def obleth_classify_request(self, body: bytes | None) -> None:
            return None

    app = HeldApp()
    app.release.set()
    middleware = WSGIGatewayMiddleware(
        app, settings=Settings(max_body_bytes=1024), plugins=[BodyClassifier()]
    )
    with serving(middleware) as url:
        answer = post(
            url,
            content=b"[" + b"1," * 1000 + b"1]",
            headers={"content-type": "application/json; charset=utf-8"},
        )
    middleware.close()

    assert answer.status_code == 413
    assert "max_body_bytes" in answer.json()["error"]["message"]
    assert app.peak == 0


def test_close_answers_the_waiters_and_a_later_request_starts_the_gateway_again(
    pool: ThreadPoolExecutor,
) -> None:
    app = HeldApp()
    middleware = gated(app, global_max_in_flight=1)
    with serving(middleware) as url:
        first = pool.submit(post, url)
        app.wait_entered(1)
        waiting: Future[httpx.Response] = pool.submit(post, url)
        wait_until(lambda: middleware.gateway.snapshot().queued == 1)
        closing = pool.submit(middleware.close)
        refused = waiting.result()
        app.release.set()
        closing.result()
        first.result()
        again = post(url)
    middleware.close()

    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "unavailable"
    assert again.status_code == 200


def test_a_bad_setting_stops_the_app_from_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OBLETH_OVERFLOW_POLICY", "nope")
    with pytest.raises(ConfigError, match="OBLETH_OVERFLOW_POLICY='nope': no overflow policy"):
        WSGIGatewayMiddleware(HeldApp())


def test_with_upstreams_the_app_reads_the_routing_decision() -> None:
    """The router chooses for a WSGI app as for an ASGI one: the record names the upstream
    and why, and ``upstream_header`` names it in the response."""
    app = HeldApp()
    app.release.set()
    with SimBackend() as first, SimBackend() as second:
        upstreams = [first.url, second.url]
        middleware = gated(
            app, upstreams=upstreams, routing_scorers="queue-depth:1", upstream_header=True
        )
        with serving(middleware) as url:
            answers = [post(url) for _ in range(4)]
        middleware.close()

    records = [answer.json()["record"] for answer in answers]
    assert all(record["upstream"] in upstreams for record in records), records
    assert all(set(record["scores"]["queue-depth"]) == set(upstreams) for record in records)
    assert [a.headers["x-obleth-upstream"] for a in answers] == [r["upstream"] for r in records]


def test_capacity_providers_that_follow_first_bytes_are_fed_from_wsgi_too() -> None:
    """The first-byte feed: once per admitted 2xx request, timed from the app's call to
    its first chunk, handed to the provider on the gateway's loop."""
    fed: list[tuple[float, bool]] = []
    gaps: list[tuple[float, float, bool]] = []

    class Timed:
        def max_in_flight(self) -> int:
            return 4

        def first_byte(self, seconds: float) -> None:
            on_loop = threading.current_thread().name == "obleth-gateway"
            fed.append((seconds, on_loop))

        def longest_gap(self, seconds: float, lasted: float) -> None:
            on_loop = threading.current_thread().name == "obleth-gateway"
            gaps.append((seconds, lasted, on_loop))

    class Plugin:
        @hookimpl
        def obleth_capacity_providers(self) -> dict[str, object]:
            return {"timed": lambda settings: Timed()}

    app = HeldApp(stream=True)
    app.release.set()
    middleware = WSGIGatewayMiddleware(
        app, settings=Settings(capacity_providers=("timed",)), plugins=[Plugin()]
    )
    with serving(middleware) as url:
        answers = [post(url) for _ in range(3)]
        missing = httpx.get(url + "/healthz", trust_env=False)  # exempt: not timed
        wait_until(lambda: len(fed) == 3 and len(gaps) >= 3)
    middleware.close()

    assert [answer.status_code for answer in answers] == [200] * 3
    assert missing.status_code == 200
    assert all(seconds >= 0 and on_loop for seconds, on_loop in fed), fed
    # each stream of several chunks told its longest gap at least once, on the loop
    assert len(gaps) >= 3 and all(0 <= gap <= lasted and loop for gap, lasted, loop in gaps)


def test_rate_and_token_budgets_hold_under_wsgi_too() -> None:
    """The budgets are the request path's, whatever the server: a tenant over its tokens
    per minute gets 429 with the wait, estimated from the JSON body the middleware read."""
    app = HeldApp()
    app.release.set()
    middleware = gated(app, tenant_header="x-tenant", tenant_tpm=1000, tenant_rpm={"b": 1})
    body = {"prompt": "x" * 400, "max_tokens": 300}  # 100 + 300 tokens each
    with serving(middleware) as url:
        by_tokens = [post(url, json=body, headers={"x-tenant": "a"}) for _ in range(3)]
        by_requests = [post(url, headers={"x-tenant": "b"}) for _ in range(2)]
    middleware.close()

    assert [answer.status_code for answer in by_tokens] == [200, 200, 429]
    assert by_tokens[2].json()["error"]["code"] == "tokens_per_minute"
    assert int(by_tokens[2].headers["retry-after"]) >= 1
    assert [answer.status_code for answer in by_requests] == [200, 429]
    assert by_requests[1].json()["error"]["code"] == "requests_per_minute"
    assert outcomes(middleware) == {
        "completed": 3,
        "rejected:tokens_per_minute": 1,
        "rejected:requests_per_minute": 1,
    }


def reporting_app(environ: dict[str, object], start_response: Any) -> Iterator[bytes]:
    """A WSGI backend reporting 10 tokens used: in a JSON body, or in a stream's last
    event, yielded chunk by chunk."""
    stream = environ.get("PATH_INFO") == "/stream"
    kind = "text/event-stream" if stream else "application/json"
    start_response("200 OK", [("Content-Type", kind)])
    if not stream:
        yield json.dumps({"choices": [], "usage": {"total_tokens": 10}}).encode()
        return
    yield b'data: {"choices": [{"text": "a"}], "usage": null}\n\n'
    last = b'data: {"choices": [], "usage": {"total_tokens": 10}}\n\ndata: [DONE]\n\n'
    yield last[:20]
    yield last[20:]


@pytest.mark.parametrize("path", ["/v1/completions", "/stream"])
def test_a_served_request_is_charged_the_tokens_its_response_reports_under_wsgi(
    path: str,
) -> None:
    """Estimated at 600 tokens of a 1 000 budget, a request whose response reports 10 used
    leaves room for the next, read in the worker thread as the ASGI path reads it."""
    middleware = gated(reporting_app, tenant_header="x-tenant", tenant_tpm=1000)
    body = {"prompt": "x" * 400, "max_tokens": 500}
    with serving(middleware) as url, httpx.Client(base_url=url, trust_env=False) as http:
        answers = [http.post(path, json=body, headers={"x-tenant": "a"}) for _ in range(3)]
    middleware.close()
    assert [answer.status_code for answer in answers] == [200] * 3
