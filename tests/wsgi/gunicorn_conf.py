"""A gunicorn configuration that starts each worker's gateway when the worker boots, as
docs/wsgi.md shows: ``gunicorn -c tests/wsgi/gunicorn_conf.py ...``."""

from __future__ import annotations

from typing import Any


def post_worker_init(worker: Any) -> None:
    worker.wsgi.start()  # the WSGIGatewayMiddleware gunicorn loaded
