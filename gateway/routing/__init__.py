"""Routing: which upstream inference server each admitted request goes to.

::

    upstreams.py     the configured upstreams (URL, models served), parsed from settings
    httpclient.py    how the gateway holds HTTP connections to upstreams (keep-alive pool)
    readings.py      the latest load reading of each upstream, for scorers and capacity
    promtext.py      Prometheus text parsing
    metricnames.py   engine metric names (vLLM, SGLang) mapped in one place
    scraper.py       the poller's HTTP/1.1 client: GETs on kept-alive connections
    activity.py      whether requests come, which sets the poller's pace
    poller.py        the background task scraping /metrics and /health
    inflight.py      our own requests in flight per upstream (cluster-wide with Redis)
    request.py       what scorers know about a request (model, prompt blocks, session),
                     read from the admitted HTTP request
    router.py        filters, scorers, picker; the Decision put in the ASGI scope
"""
