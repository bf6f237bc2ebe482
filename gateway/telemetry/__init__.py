"""OpenTelemetry for the gateway: instruments through the API only, the SDK in one module.

::

    gauges.py   the gateway's observable gauges (in flight, queue depth, capacity limit),
                read from ``Gateway.snapshot()`` when a reader collects; API only
    sdk.py      the SDK as ``obleth serve`` sets it up: a MeterProvider whose reader
                renders the Prometheus text of ``/metrics``

Code that runs inside a host application (the middleware, the backends) imports only
``opentelemetry.metrics``, so the host's own SDK setup decides where its numbers go;
without one they are no-ops.
"""
