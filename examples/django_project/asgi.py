"""The project over ASGI: ``uvicorn examples.django_project.asgi:application``."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

from gateway import GatewayMiddleware

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_project.settings")

# settings from the OBLETH_* variables; a bad one stops the server, naming it
application = GatewayMiddleware(get_asgi_application())
