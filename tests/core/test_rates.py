"""The per-tenant rate budgets as one process keeps them, on a virtual clock: a tenant may
spend its minute at once, then earns it back evenly; a reservation takes from both budgets
or from neither; a refund gives it back; idle tenants cost no memory."""

from __future__ import annotations

import pytest

from gateway.core.rates import LocalRates, RateRules


def rules(
    rpm: dict[str, int] | None = None,
    default_rpm: int | None = None,
    tpm: dict[str, int] | None = None,
    default_tpm: int | None = None,
) -> RateRules:
    return RateRules(rpm or {}, default_rpm, tpm or {}, default_tpm)


def test_a_tenant_spends_its_minute_at_once_then_earns_one_back_every_60_over_n_s() -> None:
    rates = LocalRates(rules(rpm={"a": 6}))
    assert all(rates.reserve("a", 0, now=100.0) is None for _ in range(6))
    over = rates.reserve("a", 0, now=100.0)
    assert over is not None and over.reason == "requests_per_minute"
    assert over.retry_after_s == pytest.approx(10.0)  # one request back every 10 s
    assert rates.reserve("a", 0, now=109.9) is not None
    assert rates.reserve("a", 0, now=110.0) is None
    assert rates.reserve("a", 0, now=110.0) is not None


def test_tenants_have_budgets_of_their_own_and_star_is_everyone_else() -> None:
    rates = LocalRates(rules(rpm={"free": 1}, default_rpm=2))
    assert rates.reserve("free", 0, now=0.0) is None
    assert rates.reserve("free", 0, now=0.0) is not None
    for tenant in ("x", "y"):  # each of the rest has 2 of its own
        assert rates.reserve(tenant, 0, now=0.0) is None
        assert rates.reserve(tenant, 0, now=0.0) is None
        assert rates.reserve(tenant, 0, now=0.0) is not None


def test_a_tenant_without_a_budget_is_never_refused_nor_remembered() -> None:
    rates = LocalRates(rules(rpm={"a": 1}))
    assert all(rates.reserve("b", 10**6, now=0.0) is None for _ in range(100))
    assert len(rates) == 0


def test_tokens_are_spent_by_the_request_s_estimate() -> None:
    rates = LocalRates(rules(tpm={"a": 1000}))
    assert rates.reserve("a", 600, now=0.0) is None
    over = rates.reserve("a", 600, now=0.0)
    assert over is not None and over.reason == "tokens_per_minute"
    assert over.cost == 600 and over.per_minute == 1000
    # 200 more tokens must be earned back: 200 * 60 / 1000 = 12 s
    assert over.retry_after_s == pytest.approx(12.0)
    assert rates.reserve("a", 400, now=0.0) is None  # what is left still fits


def test_a_request_over_the_whole_minute_never_fits() -> None:
    rates = LocalRates(rules(tpm={"a": 1000}))
    over = rates.reserve("a", 1001, now=0.0)
    assert over is not None and over.retry_after_s is None
    assert rates.reserve("a", 1000, now=0.0) is None  # and it took nothing


def test_a_refusal_by_one_budget_takes_nothing_from_the_other() -> None:
    rates = LocalRates(rules(rpm={"a": 10}, tpm={"a": 100}))
    assert rates.reserve("a", 100, now=0.0) is None
    for _ in range(5):
        over = rates.reserve("a", 50, now=0.0)
        assert over is not None and over.reason == "tokens_per_minute"
    # the refused ones took no request: 9 remain for small requests once tokens return
    assert sum(rates.reserve("a", 0, now=0.0) is None for _ in range(20)) == 9


def test_a_refund_gives_the_reservation_back_but_no_credit_beyond_the_minute() -> None:
    rates = LocalRates(rules(rpm={"a": 2}, tpm={"a": 100}))
    assert rates.reserve("a", 60, now=0.0) is None
    rates.refund("a", 60, now=0.0)
    assert rates.reserve("a", 100, now=0.0) is None  # the whole 100 again
    rates.refund("a", 100, now=0.0)
    rates.refund("a", 100, now=0.0)  # refunded twice: still no more than the minute
    assert rates.reserve("a", 100, now=0.0) is None
    assert rates.reserve("a", 1, now=0.0) is not None


def test_settling_charges_the_tokens_used_and_keeps_the_request_counted() -> None:
    rates = LocalRates(rules(rpm={"a": 2}, tpm={"a": 100}))
    assert rates.reserve("a", 80, now=0.0) is None
    rates.settle("a", 80, 30, now=0.0)  # used 30 of the 80 estimated
    assert rates.reserve("a", 70, now=0.0) is None  # 30 + 70
    assert rates.reserve("a", 0, now=0.0) is not None  # but two requests already
    more = LocalRates(rules(tpm={"a": 100}))
    assert more.reserve("a", 10, now=0.0) is None
    more.settle("a", 10, 130, now=0.0)  # used more than the minute: a minute's taken
    over = more.reserve("a", 1, now=0.0)
    assert over is not None and over.retry_after_s == pytest.approx(6.6)  # 10 + 100 + 1
    fresh = LocalRates(rules(tpm={"a": 100}))
    fresh.settle("a", 0, 50, now=0.0)  # forgotten meanwhile: charged from now
    assert fresh.reserve("a", 51, now=0.0) is not None
    assert fresh.reserve("a", 50, now=0.0) is None


def test_a_scale_shares_the_budget_and_never_rounds_it_to_nothing() -> None:
    rates = LocalRates(rules(rpm={"a": 10}), scale=1 / 3)  # three pods: 3 each
    assert sum(rates.reserve("a", 0, now=0.0) is None for _ in range(10)) == 3
    tiny = LocalRates(rules(rpm={"a": 1}), scale=1 / 3)
    assert tiny.reserve("a", 0, now=0.0) is None


def test_tenants_idle_for_a_minute_are_forgotten() -> None:
    """One-off tenants (a tenant per API key) must not grow the state for ever."""
    rates = LocalRates(rules(default_rpm=60))
    for n in range(5000):
        assert rates.reserve(f"t{n}", 0, now=n * 0.1) is None
    # a reservation is earned back within a second (60 per minute): at most the last
    # ~10 tenants hold anything, plus those not yet swept
    assert len(rates) <= 1024 + 10


def test_a_refusal_names_the_longer_wait_of_both_budgets() -> None:
    """A client told the first refusing budget's wait would find the other still short."""
    rates = LocalRates(rules(rpm={"a": 3}, tpm={"a": 1000}))
    for _ in range(3):
        assert rates.reserve("a", 300, now=0.0) is None
    fourth = rates.reserve("a", 300, now=0.0)  # tokens in 12 s, a request in 20 s
    assert fourth is not None and fourth.reason == "requests_per_minute"
    assert fourth.retry_after_s == pytest.approx(20.0)
    larger = rates.reserve("a", 900, now=0.0)  # 900 tokens in 48 s
    assert larger is not None and larger.reason == "tokens_per_minute"
    assert larger.retry_after_s == pytest.approx(48.0)
    never = rates.reserve("a", 5000, now=0.0)  # never, whatever the request budget says
    assert never is not None and never.retry_after_s is None
