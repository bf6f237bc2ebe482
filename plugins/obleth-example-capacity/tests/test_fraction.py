"""The ``fraction`` capacity provider, as a gateway sees it: selected by name, it makes half
of ``global_max_in_flight`` (at least one) the limit."""

from __future__ import annotations

from importlib.metadata import entry_points

from gateway import Gateway, Settings

from obleth_example_capacity import plugin


def test_fraction_admits_half_the_global_limit() -> None:
    """Selected by name, `fraction` makes half of `global_max_in_flight` the limit."""
    settings = Settings(capacity_providers=["fraction"], global_max_in_flight=10)
    gateway = Gateway(settings, plugins=[plugin], entry_points=False)
    assert gateway.capacity.current() == 5


def test_fraction_admits_at_least_one_request() -> None:
    """Half of a limit of 1 rounds down to 0, which would pause the gateway: it stays 1."""
    settings = Settings(capacity_providers=["fraction"], global_max_in_flight=1)
    gateway = Gateway(settings, plugins=[plugin], entry_points=False)
    assert gateway.capacity.current() == 1


def test_with_static_the_lower_of_the_two_limits_applies() -> None:
    """Next to `static`, `fraction` caps the limit until `static` is cut below it."""
    settings = Settings(capacity_providers=["static", "fraction"], global_max_in_flight=10)
    gateway = Gateway(settings, plugins=[plugin], entry_points=False)
    assert gateway.capacity.current() == 5
    gateway.set_capacity(3)
    assert gateway.capacity.current() == 3


def test_the_installed_distribution_declares_its_entry_point() -> None:
    """pip installed the `obleth` entry point that Obleth finds the plugin by."""
    (found,) = entry_points(group="obleth", name="example-capacity")
    assert found.load() is plugin
