"""The project over WSGI:
``gunicorn --worker-class gthread --threads 8 examples.django_project.wsgi:application``."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

from gateway.wsgi import WSGIGatewayMiddleware

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_project.settings")

# settings from the OBLETH_* variables; a bad one stops the app's loading, naming it
application = WSGIGatewayMiddleware(get_wsgi_application())
