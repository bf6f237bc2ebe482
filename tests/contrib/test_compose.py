"""contrib/compose/: a compose file valid against the Compose Specification's schema
(the copy check-jsonschema ships, read offline) whose services fit together as obleth
needs: each command parses with obleth's own parser, every port named is one obleth
listens on, the gateways route to the backends and share the Redis, Prometheus scrapes
every pod where it serves its metrics, Grafana shows contrib/grafana/obleth.json over
that Prometheus."""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from ipaddress import ip_address
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from tests.contrib.stack import (
    COMPOSE_ADMIN_TOKEN,
    COMPOSE_DIR,
    CONTRIB,
    Container,
    Doc,
    bind_mounts,
    compose_container,
    compose_file,
    compose_services,
    interpolate,
    is_liveness,
    is_metrics,
    obleth_services,
    service_env,
    target_port,
)

DASHBOARD = CONTRIB / "grafana" / "obleth.json"
#: where the images of compose.yaml read their configuration
PROMETHEUS_CONFIG = "/etc/prometheus/prometheus.yml"
GRAFANA_PROVISIONING = "/etc/grafana/provisioning"
#: a metric each kind of obleth process has on its /metrics
METRIC_OF = {"serve": "obleth_in_flight", "mock-backend": "vllm:num_requests_running"}
# the URL a container's own health check asks: python's urllib on the loopback interface
_HEALTH_URL = re.compile(r"http://127\.0\.0\.1:(\d+)(/[^'\"\s]*)")


def compose_schema() -> Doc:
    """The Compose Specification's JSON schema, as check-jsonschema vendors it."""
    try:
        from check_jsonschema.builtin_schemas import get_builtin_schema
    except ImportError:
        pytest.fail(
            "check-jsonschema is not installed: it ships the Compose Specification's "
            "schema this test checks compose.yaml against (pip install check-jsonschema)"
        )
    schema: Doc = get_builtin_schema("vendor.compose-spec")
    return schema


def schema_errors(document: Doc) -> list[str]:
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(document)
    ]


def processes(services: dict[str, Doc]) -> dict[str, Container]:
    """Every obleth service's process, by service name."""
    return {
        name: compose_container(service)
        for name, service in services.items()
        if service.get("entrypoint") == ["obleth"]
    }


def gateways() -> dict[str, Container]:
    return {n: c for n, c in processes(compose_services()).items() if c.command == "serve"}


def mounted(service: Doc, container_path: str) -> Path:
    """The host file or folder a service mounts at ``container_path`` (or above it)."""
    for target, source in bind_mounts(service).items():
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            return source / Path(container_path).relative_to(target)
    raise AssertionError(f"nothing is mounted at {container_path}")


def provisioned(grafana: Doc, kind: str) -> list[Doc]:
    """The provisioning documents of ``kind`` (datasources, dashboards) Grafana reads."""
    found = [
        yaml.safe_load(source.read_text(encoding="utf-8"))
        for target, source in bind_mounts(grafana).items()
        if target.startswith(f"{GRAFANA_PROVISIONING}/{kind}/")
    ]
    assert found, f"nothing is mounted in {GRAFANA_PROVISIONING}/{kind}/"
    return found


def test_the_compose_file_is_valid_against_the_compose_specification() -> None:
    """`docker compose` takes the file as written: it passes the Compose Specification's
    schema, before and after its variables are interpolated."""
    assert schema_errors(compose_file()) == []
    document = compose_file()
    document["services"] = compose_services()
    assert schema_errors(document) == []


def test_a_misspelt_key_or_a_port_of_the_wrong_shape_is_refused_by_the_schema_check() -> None:
    """The check above can fail: a service with `comand`, or `ports` given as a number,
    is refused."""
    misspelt = copy.deepcopy(compose_file())
    gateway = misspelt["services"]["gateway-1"]
    gateway["comand"] = gateway.pop("command")
    assert any("comand" in error for error in schema_errors(misspelt))
    wrong_shape = copy.deepcopy(compose_file())
    wrong_shape["services"]["gateway-1"]["ports"] = 9091
    assert any("ports" in error for error in schema_errors(wrong_shape))


def test_the_stack_is_three_gateways_four_backends_redis_prometheus_and_grafana() -> None:
    """Every obleth service's command parses with obleth's own parser; the stack runs
    three `obleth serve` pods, four `obleth mock-backend`s, and one each of Redis,
    Prometheus, Grafana and HAProxy."""
    services = compose_services()
    running = processes(services)
    assert Counter(c.command for c in running.values()) == {"serve": 3, "mock-backend": 4}
    images = sorted(s["image"].split(":")[0] for n, s in services.items() if n not in running)
    assert images == ["grafana/grafana", "haproxy", "prom/prometheus", "redis"]


def test_every_obleth_service_listens_beyond_loopback_on_the_ports_it_names() -> None:
    """Each obleth service listens on every interface (the default, 127.0.0.1, is out of
    other containers' reach), and every port it exposes or publishes is one obleth
    listens on: a gateway publishes its admin API's port, where the admin API answers."""
    services = compose_services()
    for name, served in processes(services).items():
        service = services[name]
        assert ip_address(served.args.host).is_unspecified, name
        named = [int(port) for port in service.get("expose", [])]
        named += [target_port(port) for port in service.get("ports", [])]
        assert named, f"{name} names no port"
        for port in named:
            assert port in served.apps, (
                f"{name} names port {port}; obleth listens on {sorted(served.apps)}"
            )
    for name, served in gateways().items():
        published = [target_port(port) for port in services[name]["ports"]]
        assert published == [served.args.admin_port], name
        openapi = served.get(served.args.admin_port, "/api/v1/openapi.json")
        assert openapi.status_code == 200, name


def test_published_host_ports_are_distinct_and_on_the_loopback_interface() -> None:
    """`docker compose up` binds every published port on the host: no two services ask
    for the same one, and none is open beyond the machine (the admin APIs, Prometheus
    and Grafana answer anyone who reaches them)."""
    published = [
        str(port) for service in compose_services().values() for port in service.get("ports", [])
    ]
    assert published
    host_ports = [entry.split(":")[1] for entry in published]
    assert all(entry.startswith("127.0.0.1:") for entry in published), published
    assert len(host_ports) == len(set(host_ports)), sorted(host_ports)


def test_the_gateways_start_in_cluster_mode_with_the_admin_token_the_user_exports() -> None:
    """Each gateway's settings are accepted by obleth serve as it starts; the three share
    one Redis and one pool; the admin token is the one exported when starting the stack,
    and compose refuses to start without one rather than fall back on a default."""
    served = gateways()
    pools = {(c.settings.redis_url, c.settings.pool) for c in served.values() if c.settings}
    assert len(pools) == 1 and None not in next(iter(pools)), pools
    for name, gateway in served.items():
        assert gateway.settings is not None
        assert gateway.settings.admin_token == COMPOSE_ADMIN_TOKEN, name
    for name in served:
        written = compose_file()["services"][name]["environment"]["OBLETH_ADMIN_TOKEN"]
        assert re.fullmatch(r"\$\{OBLETH_ADMIN_TOKEN:\?[^}]+\}", written), written
        with pytest.raises(LookupError, match="OBLETH_ADMIN_TOKEN"):
            interpolate(written, {"OBLETH_ADMIN_TOKEN": ""})


def test_the_upstreams_are_every_backend_service_on_the_port_it_listens_on() -> None:
    """Each gateway routes to the four backend services, each on its `--port`."""
    services = compose_services()
    backends = {
        (name, compose_container(service).args.port)
        for name, service in obleth_services(services, "mock-backend").items()
    }
    for name, gateway in gateways().items():
        assert gateway.settings is not None
        routed = {
            (urlsplit(u.url).hostname, urlsplit(u.url).port) for u in gateway.settings.upstreams
        }
        assert routed == backends, name


def test_the_redis_url_names_the_redis_service_on_the_port_it_listens_on() -> None:
    """OBLETH_REDIS_URL names the Redis service, on the port Redis listens on (its
    default, 6379: the command sets no other)."""
    services = compose_services()
    for name, gateway in gateways().items():
        assert gateway.settings is not None and gateway.settings.redis_url is not None
        url = urlsplit(gateway.settings.redis_url)
        redis = services[url.hostname or ""]
        assert redis["image"].startswith("redis:"), name
        assert url.port == 6379 and "--port" not in redis["command"], name


def test_every_health_check_asks_a_path_its_service_answers() -> None:
    """A container's health check asks its own process a path it answers with 200 on the
    port it listens on (the gateway's is liveness, `/healthz`), and every service others
    wait on to be healthy has a health check."""
    services = compose_services()
    for name, served in processes(services).items():
        found = _HEALTH_URL.search(" ".join(services[name]["healthcheck"]["test"]))
        assert found is not None, f"{name}'s health check asks no URL of its own"
        answer = served.get(int(found[1]), found[2])
        assert answer.status_code == 200, (name, found[0])
        if served.command == "serve":
            assert is_liveness(answer), name
    for name, service in services.items():
        depends_on = service.get("depends_on", [])
        if isinstance(depends_on, dict):  # the long form; the short one waits for no health
            for dependency, wait in depends_on.items():
                if wait.get("condition") == "service_healthy":
                    assert "healthcheck" in services[dependency], (name, dependency)


def test_prometheus_scrapes_every_obleth_service_where_it_serves_its_metrics() -> None:
    """Prometheus's targets are services of the stack on a port that answers the job's
    metrics path with Prometheus text, and every gateway and backend is among them (the
    dashboard sums over pods: one left out would be missing from every panel)."""
    services = compose_services()
    running = processes(services)
    config_file = mounted(services["prometheus"], PROMETHEUS_CONFIG)
    config = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    scraped = set()
    for job in config["scrape_configs"]:
        path = job.get("metrics_path", "/metrics")
        for group in job["static_configs"]:
            for target in group["targets"]:
                host, port = target.rsplit(":", 1)
                assert host in running, f"{job['job_name']} scrapes {host}, no obleth service"
                page = running[host].get(int(port), path)
                assert is_metrics(page, METRIC_OF[running[host].command]), target
                scraped.add(host)
    assert scraped == set(running)


def test_grafana_shows_the_dashboard_of_contrib_grafana_over_the_stacks_prometheus() -> None:
    """Grafana's provisioning makes the stack's Prometheus its default data source (what
    the dashboard's data-source variable picks) and loads contrib/grafana/obleth.json
    itself from the folder the provider reads, also set as the home dashboard."""
    services = compose_services()
    grafana = services["grafana"]
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    (datasources,) = provisioned(grafana, "datasources")
    (source,) = datasources["datasources"]
    assert (source["type"], source["isDefault"]) == (variable["query"], True)
    url = urlsplit(source["url"])
    prometheus = services[url.hostname or ""]
    assert prometheus["image"].startswith("prom/prometheus:")
    assert [target_port(port) for port in prometheus["ports"]] == [url.port]
    (dashboards,) = provisioned(grafana, "dashboards")
    (provider,) = dashboards["providers"]
    folder = mounted(grafana, provider["options"]["path"])
    assert (folder / DASHBOARD.name).samefile(DASHBOARD)
    home = service_env(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert mounted(grafana, home).samefile(DASHBOARD)


def test_every_file_the_stack_mounts_is_in_the_repository() -> None:
    """Each bind mount's source, relative to contrib/compose/, exists (a missing one
    would be mounted as an empty folder), and the obleth image is built from
    contrib/Dockerfile."""
    services = compose_services()
    for name, service in services.items():
        for target, source in bind_mounts(service).items():
            assert source.exists(), f"{name} mounts {source} at {target}: no such file"
    for name, service in obleth_services(services, "serve").items():
        build = service["build"]
        assert (COMPOSE_DIR / build["context"] / build["dockerfile"]).resolve() == (
            CONTRIB / "Dockerfile"
        ), name
