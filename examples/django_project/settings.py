"""Django settings of the example project: no database, no apps, one URL module."""

from __future__ import annotations

import os

# an example's key: set DJANGO_SECRET_KEY to anything secret before serving real traffic
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
ROOT_URLCONF = "examples.django_project.urls"
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
DATABASES: dict[str, object] = {}
USE_TZ = True
# Django sets the process time zone from this; UTC keeps the server's log times in UTC
TIME_ZONE = "UTC"
