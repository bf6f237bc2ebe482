"""Plugins installed with pip are found through the ``obleth`` entry-point group.

Each plugin distribution (the example Obleth ships under ``plugins/``, the broken ones
under ``tests/plugin_dists``) is installed once per session into its own directory; the
CLI and the gateway then run in subprocesses whose ``PYTHONPATH`` holds that directory,
so discovery goes through ``importlib.metadata`` as in production.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
#: the distributions that exist only to fail in front of the tests
DISTS = REPO / "tests" / "plugin_dists"
#: the example plugin Obleth ships, the worked example of docs/plugins.md
EXAMPLE = REPO / "plugins" / "obleth-example-capacity"


def _install(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build and install ``dist`` with pip into a fresh directory; return the directory."""
    work = tmp_path_factory.mktemp(dist.name)
    source = work / "source"
    # setuptools builds in the source tree (build/, *.egg-info): build a copy instead.
    shutil.copytree(
        dist,
        source,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache"),
    )
    target = work / "site"
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--target",
        str(target),
        str(source),
    ]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    result = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert result.returncode == 0, f"pip could not install {dist}:\n{result.stderr}"
    return target


@pytest.fixture(scope="session")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where obleth-example-capacity is installed."""
    return _install(EXAMPLE, tmp_path_factory)


@pytest.fixture(scope="session")
def broken_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where obleth-broken-plugin is installed, apart so that other tests never see it."""
    return _install(DISTS / "obleth-broken-plugin", tmp_path_factory)


@pytest.fixture(scope="session")
def exiting_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where obleth-exiting-plugin is installed, apart as well."""
    return _install(DISTS / "obleth-exiting-plugin", tmp_path_factory)


@pytest.fixture(scope="session")
def tenant_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where obleth-tenant-quota (entry point ``tenant``) is installed."""
    return _install(DISTS / "obleth-tenant-quota", tmp_path_factory)


@pytest.fixture(scope="session")
def misspelled_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where obleth-misspelled-hook is installed, apart as well."""
    return _install(DISTS / "obleth-misspelled-hook", tmp_path_factory)


def _python(
    args: Sequence[str], sites: Sequence[Path], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run Python with the installed ``sites`` and this checkout importable.

    The parent's ``OBLETH_*`` variables are dropped so that only ``env`` configures Obleth.
    """
    environ = {key: value for key, value in os.environ.items() if not key.startswith("OBLETH_")}
    environ["PYTHONPATH"] = os.pathsep.join([*map(str, sites), str(REPO)])
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=environ,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def _obleth(
    *args: str, sites: Sequence[Path], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return _python(["-m", "gateway", *args], sites, env)


def _listed(sites: Sequence[Path], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``obleth plugins --json`` as ``{plugin name: entry}``; the command must succeed."""
    result = _obleth("plugins", "--json", sites=sites, env=env)
    assert result.returncode == 0, result.stderr
    return {entry["name"]: entry for entry in json.loads(result.stdout)}


def _effective_limits(
    sites: Sequence[Path], env: Mapping[str, str], static_limits: Sequence[int] = ()
) -> list[int]:
    """The gateway's limit as built from ``env``, then after each ``set_capacity``."""
    script = textwrap.dedent(
        """
        import sys
        from gateway import Gateway

        gateway = Gateway()
        print(gateway.capacity.current())
        for limit in sys.argv[1:]:
            gateway.set_capacity(int(limit))
            print(gateway.capacity.current())
        """
    )
    result = _python(["-c", script, *map(str, static_limits)], sites, env)
    assert result.returncode == 0, result.stderr
    return [int(line) for line in result.stdout.split()]


def test_installed_plugin_is_listed_with_its_distribution_and_version(
    example_site: Path,
) -> None:
    """`obleth plugins` shows an installed plugin's distribution, version and provider."""
    listed = _listed([example_site])

    assert listed["example-capacity"] == {
        "name": "example-capacity",
        "distribution": "obleth-example-capacity",
        "version": "1.2.3",
        "provides": {"capacity provider": ["fraction"]},
    }
    assert listed["capacity-static"]["distribution"] == "obleth"


def test_installed_plugin_appears_in_the_plugins_table(example_site: Path) -> None:
    """The human-readable `obleth plugins` table has a row for an installed plugin."""
    result = _obleth("plugins", sites=[example_site])

    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("example-capacity"))
    assert row.split() == [
        "example-capacity",
        "obleth-example-capacity",
        "1.2.3",
        "capacity",
        "provider:",
        "fraction",
    ]


def test_capacity_provider_selected_by_name_sets_the_effective_limit(
    example_site: Path,
) -> None:
    """Selecting an installed plugin's provider by name makes its value the gateway's limit."""
    script = textwrap.dedent(
        """
        from gateway import Gateway, Settings

        settings = Settings(capacity_providers=["fraction"], global_max_in_flight=10)
        print(Gateway(settings).capacity.current())
        """
    )
    result = _python(["-c", script], [example_site])

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["5"]


def test_capacity_provider_selected_in_the_environment_sets_the_effective_limit(
    example_site: Path,
) -> None:
    """`OBLETH_CAPACITY_PROVIDERS=fraction` selects an installed plugin's provider."""
    env = {"OBLETH_CAPACITY_PROVIDERS": "fraction", "OBLETH_GLOBAL_MAX_IN_FLIGHT": "7"}

    assert _effective_limits([example_site], env) == [3]


def test_plugin_provider_combined_with_static_gives_the_lower_limit(example_site: Path) -> None:
    """With `static,fraction` the gateway admits the smaller of the two limits at any time."""
    env = {"OBLETH_CAPACITY_PROVIDERS": "static,fraction", "OBLETH_GLOBAL_MAX_IN_FLIGHT": "10"}

    # static starts at 10 and fraction at 5; static is then cut to 3 and raised to 40.
    assert _effective_limits([example_site], env, static_limits=[3, 40]) == [5, 3, 5]


def test_disabled_plugin_provider_can_no_longer_be_selected(example_site: Path) -> None:
    """Disabling a plugin by its entry-point name removes its provider from the choices."""
    script = textwrap.dedent(
        """
        from gateway import ConfigError, Gateway

        try:
            Gateway()
        except ConfigError as exc:
            print(exc)
        """
    )
    env = {"OBLETH_CAPACITY_PROVIDERS": "fraction", "OBLETH_DISABLE_PLUGINS": "example-capacity"}
    result = _python(["-c", script], [example_site], env)

    assert result.returncode == 0, result.stderr
    said, _, installed = result.stdout.strip().partition("; installed: ")
    assert said == "OBLETH_CAPACITY_PROVIDERS='fraction': no capacity provider by that name"
    # the built-in and whatever else this environment installed, but not the disabled one
    assert "static" in installed.split(", ")
    assert "fraction" not in installed.split(", ")


def test_broken_plugin_is_named_with_its_distribution(
    example_site: Path, broken_site: Path
) -> None:
    """A plugin that fails to import is reported by name and distribution, without a traceback."""
    result = _obleth("plugins", sites=[example_site, broken_site])

    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    message = result.stderr.strip()
    assert message.startswith("obleth: plugin 'broken' (from distribution obleth-broken-plugin")
    assert "ModuleNotFoundError" in message
    assert "obleth_missing_dependency" in message
    assert "OBLETH_DISABLE_PLUGINS=broken" in message
    assert len(message.splitlines()) == 1


@pytest.mark.parametrize("command", [("plugins",), ("demo", "--duration", "1")])
def test_a_plugin_that_calls_sys_exit_at_import_is_named_not_obeyed(
    exiting_site: Path, command: tuple[str, ...]
) -> None:
    """``sys.exit()`` in a plugin's module used to end ``obleth plugins`` (and ``serve``,
    ``demo``) silently with status 0; it is a plugin that fails to load like any other."""
    result = _obleth(*command, sites=[exiting_site])

    assert result.returncode == 2
    assert result.stdout == ""
    message = result.stderr.strip()
    assert message.startswith("obleth: plugin 'exiting' (from distribution obleth-exiting-plugin")
    assert "SystemExit" in message and "OBLETH_DISABLE_PLUGINS=exiting" in message


def test_a_plugin_named_like_a_group_of_settings_leaves_them_to_obleth(tenant_site: Path) -> None:
    """A plugin named ``tenant`` reads ``OBLETH_TENANT_*``, where Obleth's own
    ``OBLETH_TENANT_HEADER`` lives too: a typo of that setting is still an error (it used
    to be left to the plugin, and ``tenant_header`` silently unset), and the plugin's own
    check of its variables does not take the setting for a typo of its own."""
    typo = _obleth("plugins", sites=[tenant_site], env={"OBLETH_TENANT_HEADRE": "x-tenant"})
    assert typo.returncode == 2
    assert typo.stderr.startswith("obleth: OBLETH_TENANT_HEADRE='x-tenant': no such setting")
    assert "did you mean OBLETH_TENANT_HEADER?" in typo.stderr

    env = {
        "OBLETH_CAPACITY_PROVIDERS": "static,tenant-quota",
        "OBLETH_GLOBAL_MAX_IN_FLIGHT": "10",
        "OBLETH_TENANT_HEADER": "x-tenant",
        "OBLETH_TENANT_MAX_IN_FLIGHT": "4",
        "OBLETH_TENANT_QUOTA_SHARE": "0.3",
    }
    assert _effective_limits([tenant_site], env) == [3]


def test_every_broken_plugin_is_named_in_one_error(
    example_site: Path, broken_site: Path, misspelled_site: Path
) -> None:
    """Two broken distributions are reported together, each problem on a line naming its
    plugin and distribution: the operator fixes both before the next restart."""
    result = _obleth("plugins", sites=[example_site, broken_site, misspelled_site])

    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "obleth: 2 problems with plugins, each to be fixed:"
    assert len(lines) == 3
    assert lines[1].startswith(
        "  plugin 'broken' (from distribution obleth-broken-plugin 0.0.1): failed to load "
    )
    assert "ModuleNotFoundError" in lines[1]
    assert lines[2].startswith(
        "  plugin 'misspelled' (from distribution obleth-misspelled-hook 0.0.2): "
    )
    assert "implements 'obleth_capacity_provider', which is no Obleth hook" in lines[2]
    assert "(did you mean 'obleth_capacity_providers'?)" in lines[2]


def test_disabling_every_broken_plugin_lets_the_others_load(
    example_site: Path, broken_site: Path, misspelled_site: Path
) -> None:
    """Both broken plugins named in ``OBLETH_DISABLE_PLUGINS``: the working one loads."""
    sites = [example_site, broken_site, misspelled_site]
    listed = _listed(sites, env={"OBLETH_DISABLE_PLUGINS": "broken,misspelled"})

    assert listed["example-capacity"]["provides"] == {"capacity provider": ["fraction"]}


def test_disabling_a_broken_plugin_lets_the_others_load(
    example_site: Path, broken_site: Path
) -> None:
    """`OBLETH_DISABLE_PLUGINS=broken` skips the broken plugin and keeps the working ones."""
    listed = _listed([example_site, broken_site], env={"OBLETH_DISABLE_PLUGINS": "broken"})

    # The disabled name itself still shows up as a row; see test_disabled_plugin_is_not_described.
    assert listed["example-capacity"]["provides"] == {"capacity provider": ["fraction"]}
