"""`obleth demo --policy`: each built-in overflow policy runs the demo and is named."""

from __future__ import annotations

import asyncio
import io

import pytest

from gateway.cli import build_parser
from gateway.demo.run import DemoOptions, run_demo
from gateway.demo.tenants import parse_tenants


@pytest.mark.parametrize("policy", ["block", "drop-newest", "drop-oldest", "reject"])
def test_demo_runs_under_each_builtin_policy_and_names_it(policy: str) -> None:
    """The demo accepts every built-in policy, names it in its table, and keeps the
    backend within the limit with every permit released once."""
    args = build_parser().parse_args(["demo", "--max-queue", "8", "--policy", policy])
    options = DemoOptions(
        duration_s=0.5,
        limit=args.limit,
        policy=args.policy,
        tenants=parse_tenants(args.tenants, limit=args.limit, flood="bronze"),
        queue_timeout_s=args.queue_timeout,
        max_queue=args.max_queue,
    )
    out = io.StringIO()

    code = asyncio.run(run_demo(options, out))

    text = out.getvalue()
    assert code == 0
    assert f"policy {policy} " in text
    assert "never above the limit" in text and "(every one released once)" in text
