"""Weighted max-min fair shares: what each tenant should hold when seats are scarce."""

from __future__ import annotations

from collections.abc import Mapping


def fair_shares(
    capacity: float, demands: Mapping[str, float], weights: Mapping[str, float]
) -> dict[str, float]:
    """Split ``capacity`` by weighted max-min fairness (water filling).

    A tenant never gets more than it demands; what a light tenant leaves is shared by the
    others in proportion to their weights. Tenants missing from ``weights`` weigh 1.
    The result sums to ``min(capacity, sum(demands))``.
    """
    shares = {tenant: 0.0 for tenant in demands}
    active = {tenant for tenant, demand in demands.items() if demand > 0}
    left = float(capacity)
    while active and left > 1e-12:
        # shares depend on the weights' ratios alone: over the largest of those still
        # sharing, their sum stays finite (two weights of 1e308 added up to infinity, and
        # shares to 0) and at least 1, however far apart they are
        top = max(weights.get(tenant, 1.0) for tenant in active)
        weight = {tenant: weights.get(tenant, 1.0) / top for tenant in active}
        total_weight = sum(weight.values())
        unit = left / total_weight
        satisfied = {
            tenant for tenant in active if demands[tenant] - shares[tenant] <= unit * weight[tenant]
        }
        if not satisfied:
            for tenant in active:
                shares[tenant] += unit * weight[tenant]
            break
        for tenant in satisfied:
            left -= demands[tenant] - shares[tenant]
            shares[tenant] = float(demands[tenant])
        active -= satisfied
    return shares
