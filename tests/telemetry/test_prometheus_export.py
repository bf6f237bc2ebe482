"""The gateway's own ``/metrics`` page (``PrometheusExport``) and the SDK's switches."""

from __future__ import annotations

import os

import pytest

from gateway import Gateway, Settings
from gateway.telemetry.instruments import watch
from gateway.telemetry.sdk import PrometheusExport


def test_otel_sdk_disabled_turns_tracing_off_but_not_the_metrics_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """operations.md gives ``OTEL_SDK_DISABLED=true`` as the way to turn tracing off; the
    SDK's meter providers read it too, and the page used to come out empty."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    export = PrometheusExport()
    gateway = Gateway(Settings(global_max_in_flight=7), entry_points=False)
    watch(gateway, export.provider)  # held weakly: ``gateway`` keeps it
    limits = [line for line in export.render().decode().splitlines() if "limit" in line]
    assert any(line.startswith("obleth_capacity_limit") and " 7.0" in line for line in limits)
    assert os.environ["OTEL_SDK_DISABLED"] == "true"  # left as it was, for the tracer
