"""The OpenTelemetry SDK as ``obleth serve`` sets it up: a meter provider whose one reader
renders Prometheus text for ``/metrics``. The only module of the package that imports the
SDK; the instruments themselves use the API (see ``gateway.telemetry``).

Why the OpenTelemetry SDK and its Prometheus exporter rather than ``prometheus-client``
alone: the gateway's instruments are OpenTelemetry instruments, so that in middleware mode
they report wherever the host application's SDK sends its own metrics (OTLP, Prometheus,
or nowhere). ``obleth serve`` has no host, so it installs the SDK itself, with the
exporter that turns those same instruments into the text Prometheus scrapes; a second set
of ``prometheus-client`` metrics would have to be kept in step with them by hand.
``prometheus-client`` still does the text encoding, as the exporter's dependency.

The export keeps its own Prometheus registry, not ``prometheus_client.REGISTRY``: its
page holds what the meter provider collects and nothing another library registered.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from importlib.metadata import entry_points

from opentelemetry import metrics, trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.environment_variables import OTEL_SDK_DISABLED
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from prometheus_client import CollectorRegistry, generate_latest

from gateway.errors import ConfigError

log = logging.getLogger("obleth.telemetry")


class PrometheusExport:
    """A meter provider with one Prometheus reader; ``render()`` is the text of one scrape.

    ``host_provider`` is the process's global meter provider when it was not this one (a
    host set up its own SDK first), None otherwise.
    """

    def __init__(self) -> None:
        self._registry = CollectorRegistry(auto_describe=True)
        reader = PrometheusMetricReader(registry=self._registry)
        # OTEL_SDK_DISABLED turns the SDK's telemetry off (tracing, as operations.md
        # says), not the gateway's own /metrics page: the provider is built without it
        hidden = os.environ.pop(OTEL_SDK_DISABLED, None)
        try:
            self.provider = MeterProvider(metric_readers=[reader], resource=_resource())
        finally:
            if hidden is not None:
                os.environ[OTEL_SDK_DISABLED] = hidden
        self.host_provider: metrics.MeterProvider | None = None

    def render(self) -> bytes:
        """Collect every instrument of ``provider`` now (observable gauges call their
        callbacks) and return the Prometheus text format, version 0.0.4."""
        return generate_latest(self._registry)

    def shutdown(self) -> None:
        """Stop the provider; later scrapes render an empty page."""
        self.provider.shutdown()


def install_prometheus_export() -> PrometheusExport:
    """A ``PrometheusExport`` made the process's global meter provider, so that every
    instrument created through the API reports to it and appears on ``/metrics``.

    A host's own setup is respected: when the global provider already is an SDK one (the
    process runs under ``opentelemetry-instrument``, say), it stays, the API's
    instruments keep reporting there, and the export returned is private to what is
    registered with it directly (its ``host_provider`` says so). Call it once per process,
    before the gateway is built.
    """
    export = PrometheusExport()
    current = metrics.get_meter_provider()
    if isinstance(current, MeterProvider):
        export.host_provider = current
        log.info(
            "an OpenTelemetry MeterProvider is already set up; obleth's instruments report "
            "to it, and /metrics shows the gateway's gauges only"
        )
        return export
    metrics.set_meter_provider(export.provider)
    installed = metrics.get_meter_provider()
    if installed is not export.provider:  # another kind of provider was set; OTel said so
        export.host_provider = installed
    return export


#: where span exporters are found by name: the OpenTelemetry SDK's own group, in which the
#: SDK offers ``console`` and the OTLP packages ``otlp_proto_http`` and ``otlp_proto_grpc``
EXPORTER_GROUP = "opentelemetry_traces_exporter"

#: ``otlp`` as OTEL_EXPORTER_OTLP_PROTOCOL chooses it (the specification's default is HTTP)
_OTLP_BY_PROTOCOL = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}


def install_tracing(environ: Mapping[str, str] = os.environ) -> TracerProvider | None:
    """The tracer provider ``obleth serve`` sets up from the standard ``OTEL_*`` variables,
    made the process's global one; None when nothing is to be traced.

    - ``OTEL_SDK_DISABLED=true``: nothing.
    - ``OTEL_TRACES_EXPORTER``: exporter names, comma-separated (``otlp``, ``console``,
      ``none``, or any name a package registers in ``opentelemetry_traces_exporter``).
      Unset, spans go to ``otlp`` when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its
      ``_TRACES_`` form) is set, and nowhere otherwise: a gateway nobody told to trace
      does not try to reach a collector.
    - Everything else is the SDK's and the exporters' own reading: ``OTEL_SERVICE_NAME``
      and ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` (and ``_ARG``),
      ``OTEL_BSP_*``, ``OTEL_EXPORTER_OTLP_*``.

    A host that set up tracing first (``opentelemetry-instrument obleth serve``) keeps its
    provider. An exporter that is not installed stops startup with a ``ConfigError`` that
    names the variable and the package to install.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        log.info("an OpenTelemetry TracerProvider is already set up; admission spans go there")
        return None
    names = _exporter_names(environ)
    if not names:
        return None
    exporters = [_exporter(name, environ) for name in names]
    provider = TracerProvider(resource=_resource())
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def _exporter_names(environ: Mapping[str, str]) -> list[str]:
    given = environ.get("OTEL_TRACES_EXPORTER")
    if given is None:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    names = [name.strip().lower() for name in given.split(",") if name.strip()]
    return [name for name in names if name != "none"]


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    wanted = name
    if name == "otlp":
        # the traces' own variable first, as the SDK reads them; an error names the one set
        variable = next(
            (
                v
                for v in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
                if environ.get(v)
            ),
            None,
        )
        protocol = "http/protobuf" if variable is None else environ[variable]
        wanted = _OTLP_BY_PROTOCOL.get(protocol.strip(), "")
        if not wanted:
            raise ConfigError(
                variable or "OTEL_EXPORTER_OTLP_PROTOCOL",
                protocol,
                f"one of {', '.join(_OTLP_BY_PROTOCOL)}",
            )
    found = {entry.name: entry for entry in entry_points(group=EXPORTER_GROUP)}
    entry = found.get(wanted)
    if entry is None:
        package = {
            "otlp_proto_http": "obleth[otlp] (opentelemetry-exporter-otlp-proto-http)",
            "otlp_proto_grpc": "opentelemetry-exporter-otlp-proto-grpc",
        }.get(wanted, f"the package that offers the {name!r} span exporter")
        raise ConfigError(
            "OTEL_TRACES_EXPORTER",
            name,
            f"an installed span exporter ({', '.join(sorted(found)) or 'none'}, or otlp); "
            f"pip install {package}",
        )
    exporter: SpanExporter = entry.load()()
    return exporter


def _resource() -> Resource:
    """What the environment says (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``),
    with ``service.name`` ``obleth`` when it names no service."""
    detected = Resource.create()
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        detected = detected.merge(Resource({SERVICE_NAME: "obleth"}))
    return detected
