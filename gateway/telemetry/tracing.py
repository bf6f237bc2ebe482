"""Admission spans, through the OpenTelemetry API only.

Each request the gateway admits or refuses gets one span, ``obleth admission``, from its
arrival to the gate's answer (and the router's, when there are upstreams). Its
attributes say who asked (``obleth.tenant``, ``obleth.priority``), how it went
(``obleth.outcome``, ``obleth.reason``), how long it waited (``obleth.wait_s``) and where
it went (``obleth.upstream``). A refused request's span has the status ``ERROR``.

Spans are made only while the process has a tracer provider that is not the API's
default (an application set up the SDK, or ``obleth serve`` did from the ``OTEL_*``
variables); otherwise the request path does not touch the API at all. The span is the
child of the request's current span (an ASGI instrumentation's server span, say), else of
the ``traceparent`` the client sent.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from gateway.core.tickets import Ticket
from gateway.types import Scope

SPAN_NAME = "obleth admission"


def active_tracer() -> Tracer | None:
    """The gateway's tracer when the process traces, else None."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer("obleth")


def open_span(tracer: Tracer, scope: Scope) -> Span:
    """The admission span of the request of ``scope``, started now. Its attributes are
    all set when it ends, in one call, and only when it is sampled: the SDK takes a lock
    per call."""
    context = None
    if not trace.get_current_span().get_span_context().is_valid:
        headers = scope["headers"]
        for name, _ in headers:
            if name == b"traceparent":
                context = propagate.extract(headers, getter=_HEADERS)
                break
    return tracer.start_span(SPAN_NAME, context=context, kind=SpanKind.INTERNAL)


def close_span(
    span: Span,
    scope: Scope,
    outcome: str,
    ticket: Ticket | None,
    *,
    reason: str = "",
    waited_s: float | None = None,
    upstream: str | None = None,
) -> None:
    """End ``span`` with what the gate decided; ``outcome`` ``admitted`` or why not.
    ``ticket``: who asked; None for a request refused before it was classified."""
    if span.is_recording():
        attributes: dict[str, str | float] = {
            "http.request.method": scope["method"],
            "url.path": scope["path"],
            "obleth.outcome": outcome,
        }
        if ticket is not None:
            attributes["obleth.tenant"] = ticket.tenant
            attributes["obleth.priority"] = ticket.priority
        if reason:
            attributes["obleth.reason"] = reason
        if waited_s is not None:
            attributes["obleth.wait_s"] = waited_s
        if upstream is not None:
            attributes["obleth.upstream"] = upstream
        span.set_attributes(attributes)
        if reason:
            span.set_status(Status(StatusCode.ERROR, f"{outcome}: {reason}"))
    span.end()


class _ScopeHeaders(Getter[Iterable[tuple[bytes, bytes]]]):
    """Reads propagation headers (``traceparent``, ``baggage``) from an ASGI scope's."""

    def get(self, carrier: Iterable[tuple[bytes, bytes]], key: str) -> list[str] | None:
        wanted = key.lower().encode("latin-1")
        found = [value.decode("latin-1") for name, value in carrier if name == wanted]
        return found or None

    def keys(self, carrier: Iterable[tuple[bytes, bytes]]) -> list[str]:
        return [name.decode("latin-1") for name, _ in carrier]


_HEADERS = _ScopeHeaders()
