"""The example project's routes."""

from __future__ import annotations

from django.urls import path

from examples.django_project import views

urlpatterns = [
    path("v1/chat/completions", views.chat_completions),
    path("stats", views.stats),
    path("healthz", views.healthz),
]
