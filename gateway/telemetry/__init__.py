"""OpenTelemetry for the gateway: instruments through the API only, the SDK in one module.

::

    tallies.py      counts the request path keeps (how requests ended, how upstreams
                    answered) in plain dictionaries, tenant names bounded
    instruments.py  the gateway's metrics, nearly all observable: read from the gateway
                    (snapshot, providers, tallies, router) when a reader collects
    tracing.py      the admission span of each request, while the process traces
    sdk.py          the SDK as ``obleth serve`` sets it up: a MeterProvider whose reader
                    renders the Prometheus text of ``/metrics``

Code that runs inside a host application (the middleware, the backends) imports only
``opentelemetry.metrics``, so the host's own SDK setup decides where its numbers go;
without one they are no-ops.
"""
