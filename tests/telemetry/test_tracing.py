"""Admission spans: one per request the gate answered, with who asked, how it went, how
long it waited and where it went; made through the OpenTelemetry API, exported where the
application's SDK (or ``obleth serve``'s, from ``OTEL_*``) sends them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from opentelemetry.util._once import Once

from gateway import GatewayMiddleware
from gateway.cli import main
from gateway.loopback import serve_in_task, serve_in_thread
from gateway.settings import Settings
from gateway.types import Receive, Scope, Send
from tests.cluster.pods import ServePod
from tests.proxy.serving import serving
from tests.proxy.upstreams import Echo, eventually, read_body, within

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider made the process's global one for one test, as an
    application sets it up; the API allows setting it once per process, so the test
    puts the API's own state back afterwards."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = (trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE)
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved


class Holding:
    """An app that answers at once, or holds ``/hold`` until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/hold":
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def seat_held(
    http: httpx.AsyncClient, gated: GatewayMiddleware, headers: dict[str, str]
) -> asyncio.Future[httpx.Response]:
    """A request to ``/hold``, once it holds the gateway's only seat (``Holding`` keeps it
    until released)."""
    holding = asyncio.ensure_future(http.get("/hold", headers=headers))
    await eventually(lambda: gated.gateway.snapshot().inflight == 1, "a request holding")
    return holding


@pytest.mark.anyio
async def test_each_request_gets_an_admission_span(spans: InMemorySpanExporter) -> None:
    """acme is admitted at once, beta waits for acme's seat, gamma is refused: three spans
    say so, the refused one with the status ERROR and its reason; a client's traceparent
    makes the span part of the client's trace."""
    app = Holding()
    settings = Settings(
        global_max_in_flight=1,
        max_queue=1,
        overflow_policy="drop-newest",
        tenant_header="x-tenant",
    )
    gated = GatewayMiddleware(app, settings)
    async with (
        serve_in_task(gated) as server,
        httpx.AsyncClient(base_url=server.url, trust_env=False) as http,
    ):
        holding = await seat_held(http, gated, {"x-tenant": "acme", "traceparent": TRACEPARENT})
        waiting = asyncio.ensure_future(http.get("/", headers={"x-tenant": "beta"}))
        await eventually(lambda: gated.gateway.snapshot().queued == 1, "beta waiting")
        refused = await http.get("/", headers={"x-tenant": "gamma"})
        assert refused.status_code == 503
        app.release.set()
        assert (await within(holding, "acme's answer")).status_code == 200
        assert (await within(waiting, "beta's answer")).status_code == 200

    found = {span.attributes["obleth.tenant"]: span for span in spans.get_finished_spans()}
    assert set(found) == {"acme", "beta", "gamma"}
    assert {span.name for span in found.values()} == {"obleth admission"}
    acme, beta, gamma = found["acme"], found["beta"], found["gamma"]
    assert acme.attributes["obleth.outcome"] == "admitted"
    assert acme.attributes["obleth.priority"] == "standard"
    assert acme.attributes["obleth.wait_s"] == 0.0
    assert acme.status.status_code is StatusCode.UNSET
    assert format(acme.context.trace_id, "032x") == TRACE_ID
    assert acme.parent is not None and format(acme.parent.span_id, "016x") == PARENT_ID
    assert beta.attributes["obleth.outcome"] == "admitted"
    assert beta.attributes["obleth.wait_s"] > 0
    assert format(beta.context.trace_id, "032x") != TRACE_ID  # a trace of its own
    assert gamma.attributes["obleth.outcome"] == "rejected"
    assert gamma.attributes["obleth.reason"] == "queue_full"
    assert 0 <= gamma.attributes["obleth.wait_s"] < beta.attributes["obleth.wait_s"]
    assert gamma.status.status_code is StatusCode.ERROR


@pytest.mark.anyio
async def test_a_request_refused_after_queueing_says_how_long_it_waited(
    spans: InMemorySpanExporter,
) -> None:
    """beta queues behind acme until ``queue_timeout_s`` ends its wait: its span, refused
    with the reason ``queue_timeout``, carries the time it spent queued."""
    app = Holding()
    settings = Settings(global_max_in_flight=1, queue_timeout_s=0.3, tenant_header="x-tenant")
    gated = GatewayMiddleware(app, settings)
    async with (
        serve_in_task(gated) as server,
        httpx.AsyncClient(base_url=server.url, trust_env=False) as http,
    ):
        holding = await seat_held(http, gated, {"x-tenant": "acme"})
        refused = await http.get("/", headers={"x-tenant": "beta"})
        assert refused.status_code == 503
        app.release.set()
        assert (await within(holding, "acme's answer")).status_code == 200

    beta = next(s for s in spans.get_finished_spans() if s.attributes["obleth.tenant"] == "beta")
    assert beta.attributes["obleth.outcome"] == "rejected"
    assert beta.attributes["obleth.reason"] == "queue_timeout"
    assert beta.attributes["obleth.wait_s"] >= 0.3


@pytest.mark.anyio
async def test_a_request_refused_before_classification_names_the_tenant_its_headers_do(
    spans: InMemorySpanExporter,
) -> None:
    """A JSON body over ``max_body_bytes`` is refused while the gateway reads it to route
    it, before the classifier ran: its span names the tenant of ``x-tenant``, as the
    metric counts it, since the built-in classifier reads the headers alone."""
    async with (
        serving(tenant_header="x-tenant", max_body_bytes=100) as served,
        httpx.AsyncClient(base_url=served.url, trust_env=False) as http,
    ):
        refused = await http.post("/v1/x", json={"pad": "x" * 200}, headers={"x-tenant": "acme"})
        assert refused.status_code == 413

    (span,) = spans.get_finished_spans()
    assert span.attributes["obleth.outcome"] == "bad_request"
    assert span.attributes["obleth.reason"] == "413"
    assert span.attributes["obleth.tenant"] == "acme"
    assert span.status.status_code is StatusCode.ERROR


@pytest.mark.anyio
async def test_without_a_tracer_provider_no_span_is_made() -> None:
    """The API's default provider: the gateway does not trace (and costs nothing for it)."""
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    gated = GatewayMiddleware(Holding(), Settings())
    async with serve_in_task(gated) as server, httpx.AsyncClient(trust_env=False) as http:
        assert (await http.get(f"{server.url}/")).status_code == 200
    assert gated.gateway.tracer is None


class Collector:
    """An OTLP/HTTP trace receiver: keeps every span it is sent, decoded."""

    def __init__(self) -> None:
        self.spans: list[object] = []
        self.lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if scope["path"] == "/v1/traces":
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            with self.lock:
                for resource in request.resource_spans:
                    for scoped in resource.scope_spans:
                        self.spans.extend((resource.resource, span) for span in scoped.spans)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def test_obleth_serve_sends_spans_where_the_otel_variables_say() -> None:
    """``OTEL_EXPORTER_OTLP_ENDPOINT`` and ``OTEL_SERVICE_NAME``, as every OpenTelemetry
    SDK reads them: the spans of a served request reach a real OTLP receiver, named by
    the service, once the gateway shuts down (or its batch is sent)."""
    collector = Collector()
    with (
        serve_in_thread(collector, lifespan="off") as receiver,
        serve_in_thread(Echo(), lifespan="off") as upstream,
    ):
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_SERVICE_NAME": "gateway-under-test",
            "OBLETH_TENANT_HEADER": "x-tenant",
        }
        with ServePod([upstream.url], env=env, name="tracing") as pod:
            answer = httpx.get(
                f"{pod.url}/version",
                headers={"x-tenant": "acme", "traceparent": TRACEPARENT},
                trust_env=False,
            )
            assert answer.status_code == 200
        with collector.lock:
            received = list(collector.spans)
    assert len(received) == 1, pod.log_tail()
    resource, span = received[0]
    service = {a.key: a.value.string_value for a in resource.attributes}["service.name"]
    assert service == "gateway-under-test"
    attributes = {a.key: a.value for a in span.attributes}
    assert span.name == "obleth admission"
    assert span.trace_id.hex() == TRACE_ID
    assert attributes["obleth.tenant"].string_value == "acme"
    assert attributes["obleth.outcome"].string_value == "admitted"
    assert attributes["obleth.upstream"].string_value == upstream.url


def test_an_exporter_that_is_not_installed_stops_serve_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    assert main(["serve", "--upstream", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("obleth: OTEL_TRACES_EXPORTER='zipkin': an installed span exporter")
    assert "pip install" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"]
)
def test_an_unknown_otlp_protocol_stops_serve_naming_the_variable_that_was_set(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str
) -> None:
    """The traces' own variable used to be reported as the general one, which the
    operator never set."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    monkeypatch.setenv(variable, "http/json")
    assert main(["serve", "--upstream", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"obleth: {variable}='http/json': one of http/protobuf, grpc")
