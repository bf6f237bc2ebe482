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

from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from prometheus_client import CollectorRegistry, generate_latest

log = logging.getLogger("obleth.telemetry")


class PrometheusExport:
    """A meter provider with one Prometheus reader; ``render()`` is the text of one scrape.

    ``host_provider`` is the process's global meter provider when it was not this one (a
    host set up its own SDK first), None otherwise.
    """

    def __init__(self) -> None:
        self._registry = CollectorRegistry(auto_describe=True)
        reader = PrometheusMetricReader(registry=self._registry)
        self.provider = MeterProvider(metric_readers=[reader], resource=_resource())
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
    instrument created through the API (the cluster gauges of the Redis backend among
    them) reports to it and appears on ``/metrics``.

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


def _resource() -> Resource:
    """What the environment says (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``),
    with ``service.name`` ``obleth`` when it names no service."""
    detected = Resource.create()
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        detected = detected.merge(Resource({SERVICE_NAME: "obleth"}))
    return detected
