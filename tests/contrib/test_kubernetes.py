"""contrib/kubernetes/: a kustomize base that Kubernetes accepts (every document checked
against the API's schemas, offline) and whose parts fit together as obleth needs them to:
the settings are real settings, the commands parse with obleth's own parser, the probes,
Services and policies reach the ports obleth really serves them on, the upstreams are the
backend pods, and the pods run unprivileged."""

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Iterator, Mapping
from ipaddress import ip_address
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from gateway.cli.serve import GRACEFUL_S
from gateway.errors import ConfigError
from gateway.settings import ENV_PREFIX, Settings, setting_names
from tests.contrib.stack import (
    CONTRIB,
    Container,
    Doc,
    container,
    is_liveness,
    is_metrics,
    is_readiness,
    obleth_argv,
)

BASE = CONTRIB / "kubernetes"
#: the oldest Kubernetes the base is checked against, and the newest the schemas know
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
#: what an operator puts in the Secret instead of the shipped placeholder
OPERATOR_TOKEN = "k8s-test-admin-token-0123456789"
WORKLOADS = ("Deployment", "StatefulSet")


def kustomization() -> Doc:
    loaded: Doc = yaml.safe_load((BASE / "kustomization.yaml").read_text(encoding="utf-8"))
    return loaded


def manifests() -> Iterator[tuple[str, Doc]]:
    """Every document of every file the kustomization lists, with its file's name."""
    for name in kustomization()["resources"]:
        for document in yaml.safe_load_all((BASE / name).read_text(encoding="utf-8")):
            if document is not None:
                yield name, document


def documents(kind: str) -> list[Doc]:
    return [doc for _, doc in manifests() if doc["kind"] == kind]


def the(kind: str, name: str) -> Doc:
    """The one document of ``kind`` called ``name``."""
    found = [doc for doc in documents(kind) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} documents named {name!r}"
    return found[0]


def workloads() -> list[Doc]:
    return [doc for _, doc in manifests() if doc["kind"] in WORKLOADS]


def pod_labels(workload: Doc) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def selected(selector: Mapping[str, str]) -> list[Doc]:
    """The workloads whose pods carry every label of ``selector``."""
    assert selector, "an empty selector selects every pod"
    return [w for w in workloads() if selector.items() <= pod_labels(w).items()]


def the_selected(selector: Mapping[str, str], what: str) -> Doc:
    found = selected(selector)
    assert len(found) == 1, f"{what} selects the pods of {len(found)} workloads: {selector}"
    return found[0]


def only_container(workload: Doc) -> Doc:
    containers: list[Doc] = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, workload["metadata"]["name"]
    return containers[0]


def container_port(spec: Doc, port: int | str) -> int:
    """The number of ``port``, a name or a number, which the container must declare."""
    numbers: set[int] = {p["containerPort"] for p in spec["ports"]}
    named: dict[str, int] = {p["name"]: p["containerPort"] for p in spec["ports"] if "name" in p}
    if isinstance(port, int):
        assert port in numbers, f"{spec['name']} declares no port {port}: {sorted(numbers)}"
        return port
    assert port in named, f"{spec['name']} has no port named {port!r}: {sorted(named)}"
    return named[port]


def secret_value(name: str, key: str) -> str:
    """``key`` of the base's Secret ``name``, whether written as text or base64."""
    secret = the("Secret", name)
    if key in secret.get("stringData", {}):
        value: str = secret["stringData"][key]
        return value
    assert key in secret.get("data", {}), f"Secret {name} has no key {key!r}"
    return base64.b64decode(secret["data"][key]).decode()


def pod_env(workload: Doc) -> dict[str, str]:
    """The environment of the workload's container, as the kubelet builds it from its
    ConfigMaps, Secrets and values (later entries win, ``env`` over ``envFrom``)."""
    spec = only_container(workload)
    environ: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        environ.update(the("ConfigMap", source["configMapRef"]["name"])["data"])
    for variable in spec.get("env", []):
        if "value" in variable:
            environ[variable["name"]] = variable["value"]
        else:
            ref = variable["valueFrom"]["secretKeyRef"]
            assert not ref.get("optional", False), f"{variable['name']} may be left unset"
            environ[variable["name"]] = secret_value(ref["name"], ref["key"])
    return environ


def running(workload: Doc) -> Container:
    """The obleth process of the workload's container, once the operator has replaced the
    admin token's placeholder."""
    spec = only_container(workload)
    environ = pod_env(workload)
    if "OBLETH_ADMIN_TOKEN" in environ:
        environ["OBLETH_ADMIN_TOKEN"] = OPERATOR_TOKEN
    return container(obleth_argv(spec["command"], spec.get("args", [])), environ)


def obleth_pods() -> list[Doc]:
    """The workloads whose container runs obleth."""
    return [w for w in workloads() if only_container(w).get("command") == ["obleth"]]


def obleth_workloads(command: str) -> list[Doc]:
    found = [w for w in obleth_pods() if only_container(w)["args"][:1] == [command]]
    assert found, f"no workload runs obleth {command}"
    return found


def admin_token_ref() -> Doc:
    """Where the gateway's container takes OBLETH_ADMIN_TOKEN from."""
    (variable,) = [v for v in only_container(gateway())["env"] if v["name"] == "OBLETH_ADMIN_TOKEN"]
    ref: Doc = variable["valueFrom"]["secretKeyRef"]
    return ref


def gateway() -> Doc:
    (found,) = obleth_workloads("serve")
    return found


def test_the_kustomization_lists_every_manifest_of_the_folder_and_each_parses() -> None:
    """`kubectl apply -k` applies every file of the folder, once: the kustomization names
    them all and nothing else; each holds named documents, none named twice; the base's
    namespace is one it creates."""
    resources = kustomization()["resources"]
    on_disk = {p.name for p in BASE.iterdir() if p.suffix in (".yaml", ".yml")}
    assert len(resources) == len(set(resources)), resources
    assert set(resources) == on_disk - {"kustomization.yaml"}
    assert {p.name for p in BASE.iterdir()} == on_disk, "files kustomize would not apply"
    identities = [(doc["kind"], doc["metadata"]["name"]) for _, doc in manifests()]
    assert all(doc["apiVersion"] for _, doc in manifests())
    assert len(identities) == len(set(identities)), sorted(identities)
    assert {kind for kind, _ in identities} >= {
        "Deployment",
        "StatefulSet",
        "Service",
        "ConfigMap",
        "Secret",
    }
    assert [ns["metadata"]["name"] for ns in documents("Namespace")] == [
        kustomization()["namespace"]
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_document_is_valid_for_the_kubernetes_api(version: str) -> None:
    """The API server takes every document as written: each is checked against that
    Kubernetes version's schema, unknown fields refused (kubernetes-validate's strict
    mode; its schemas are installed with it)."""
    for name, document in manifests():
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            kind, metadata = document["kind"], document["metadata"]["name"]
            pytest.fail(f"{name}: {kind} {metadata}: {exc.message} at {list(exc.path)}")


def test_a_misspelt_field_is_refused_by_the_schema_check() -> None:
    """The check above can fail: the gateway's Deployment with `replica` for `replicas`,
    or a port given as a word, is refused."""
    misspelt = copy.deepcopy(gateway())
    misspelt["spec"]["replica"] = misspelt["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelt, VERSIONS[-1], strict=True)
    wrong_type = copy.deepcopy(gateway())
    only_container(wrong_type)["ports"][0]["containerPort"] = "eight thousand"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong_type, VERSIONS[-1], strict=True)


def test_every_obleth_variable_of_the_configmap_is_a_real_setting() -> None:
    """A misspelt variable would stop every gateway pod at startup: each key of the
    settings ConfigMap is `OBLETH_` and the upper-case name of a `Settings` field."""
    data = the("ConfigMap", "obleth-settings")["data"]
    settings = set(setting_names())
    assert data
    for key in data:
        assert key.startswith(ENV_PREFIX) and key == key.upper(), key
        assert key.removeprefix(ENV_PREFIX).lower() in settings, f"{key} is no setting"


def test_the_gateway_pods_settings_start_a_gateway_in_cluster_mode_with_the_admin_api() -> None:
    """What a gateway pod reads (the ConfigMap, the Secret, its flags) is accepted by
    obleth serve as it starts: the values parse, the plugins they name exist; the pods
    share Redis and have the admin API on."""
    served = running(gateway())
    assert served.settings is not None
    assert served.settings.redis_url is not None
    assert served.settings.admin_token == OPERATOR_TOKEN
    assert gateway()["spec"]["replicas"] >= 2


def test_every_container_command_parses_with_obleths_parser_and_listens_beyond_loopback() -> None:
    """Each obleth container runs `obleth serve` or `obleth mock-backend` with flags
    obleth accepts, listening on every interface (the default, 127.0.0.1, would be
    unreachable from other pods), and declares each port it listens on."""
    assert sorted(running(w).command for w in obleth_pods()) == ["mock-backend", "serve"]
    for workload in obleth_pods():
        served = running(workload)
        assert ip_address(served.args.host).is_unspecified, workload["metadata"]["name"]
        declared = {p["containerPort"] for p in only_container(workload)["ports"]}
        assert declared == set(served.apps), workload["metadata"]["name"]


def test_the_admin_token_is_read_from_the_key_the_bases_secret_holds() -> None:
    """OBLETH_ADMIN_TOKEN comes from a Secret of the base, by a key that Secret has, and
    not optionally: until the Secret exists a gateway pod waits for it rather than start
    with its admin API off; the token is in no ConfigMap."""
    ref = admin_token_ref()
    assert secret_value(ref["name"], ref["key"])
    assert "OBLETH_ADMIN_TOKEN" not in the("ConfigMap", "obleth-settings")["data"]


def test_the_shipped_admin_token_is_a_placeholder_obleth_refuses() -> None:
    """Nobody runs a gateway whose admin token is published in this repository: the
    Secret's placeholder stops obleth at startup, naming OBLETH_ADMIN_TOKEN."""
    ref = admin_token_ref()
    placeholder = secret_value(ref["name"], ref["key"])
    with pytest.raises(ConfigError, match="OBLETH_ADMIN_TOKEN"):
        Settings.from_env({"OBLETH_ADMIN_TOKEN": placeholder})


def test_the_gateways_probes_ask_the_port_that_answers_them() -> None:
    """Kubernetes takes a pod out of the Service on `/readyz` (80 % of the queue bound
    waiting, no healthy backend) and restarts it on `/healthz`: both on the port where
    obleth serve answers them, which is the traffic port, not the admin API's."""
    spec = only_container(gateway())
    served = running(gateway())
    readiness = spec["readinessProbe"]["httpGet"]
    liveness = spec["livenessProbe"]["httpGet"]
    assert readiness["path"] == "/readyz"
    assert liveness["path"] == "/healthz"
    port = container_port(spec, readiness["port"])
    assert is_readiness(served.get(port, "/readyz")), f"port {port} does not answer /readyz"
    port = container_port(spec, liveness["port"])
    assert is_liveness(served.get(port, "/healthz")), f"port {port} does not answer /healthz"


def test_the_named_ports_are_the_ones_obleth_serve_was_told() -> None:
    """The `http` port is `--port` (traffic, probes, metrics) and `admin` is
    `--admin-port`, where the admin API answers; the Prometheus annotation names the port
    that serves `/metrics`."""
    spec = only_container(gateway())
    served = running(gateway())
    assert container_port(spec, "http") == served.args.port
    assert container_port(spec, "admin") == served.args.admin_port == 9090
    openapi = served.get(served.args.admin_port, "/api/v1/openapi.json")
    assert openapi.status_code == 200 and "/api/v1/capacity" in openapi.json()["paths"]
    annotations = gateway()["spec"]["template"]["metadata"]["annotations"]
    page = served.get(int(annotations["prometheus.io/port"]), annotations["prometheus.io/path"])
    assert is_metrics(page, "obleth_in_flight")


def test_the_backends_probes_ask_the_port_that_answers_them() -> None:
    """A backend pod is ready when the simulator answers `/health` on its port."""
    (backend,) = obleth_workloads("mock-backend")
    spec = only_container(backend)
    served = running(backend)
    for probe in ("readinessProbe", "livenessProbe"):
        get = spec[probe]["httpGet"]
        assert served.get(container_port(spec, get["port"]), get["path"]).status_code == 200


def test_every_service_selects_one_workloads_pods_on_ports_they_declare() -> None:
    """Each Service's selector matches the pods of exactly one workload (and its own
    selector, its template's labels), and each target port is a port those pods declare."""
    for workload in workloads():
        selector = workload["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod_labels(workload).items(), workload["metadata"]["name"]
    services = documents("Service")
    assert {s["metadata"]["name"] for s in services} == {"obleth", "redis", "mock-backend"}
    for service in services:
        name = service["metadata"]["name"]
        target = the_selected(service["spec"]["selector"], f"Service {name}")
        for port in service["spec"]["ports"]:
            container_port(only_container(target), port["targetPort"])
    traffic = the_selected(the("Service", "obleth")["spec"]["selector"], "Service obleth")
    assert traffic["metadata"]["name"] == gateway()["metadata"]["name"]


def test_the_disruption_budget_and_network_policies_select_the_pods_they_mean() -> None:
    """The disruption budget covers the gateway's pods; each network policy lets the
    gateway's pods, and only them, reach Redis and the backends on the ports those serve."""
    budget = the("PodDisruptionBudget", "obleth-gateway")
    assert the_selected(budget["spec"]["selector"]["matchLabels"], "the budget") == gateway()
    policies = documents("NetworkPolicy")
    protected = set()
    for policy in policies:
        name = policy["metadata"]["name"]
        target = the_selected(policy["spec"]["podSelector"]["matchLabels"], name)
        protected.add(target["metadata"]["name"])
        (rule,) = policy["spec"]["ingress"]
        sources = [s["podSelector"]["matchLabels"] for s in rule["from"]]
        assert [the_selected(s, name) for s in sources] == [gateway()], name
        for port in rule["ports"]:
            container_port(only_container(target), port["port"])
    assert protected == {"redis", "mock-backend"}


def test_the_upstreams_are_each_backend_pod_on_the_port_it_serves() -> None:
    """The gateway routes to every backend pod by its own DNS name (StatefulSet pod,
    headless Service), on the port `obleth mock-backend` listens on, and to nothing else."""
    served = running(gateway())
    assert served.settings is not None
    (backend,) = obleth_workloads("mock-backend")
    backend_port = running(backend).args.port
    service = the("Service", backend["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None", "a virtual IP would hide the pods"
    selects = the_selected(service["spec"]["selector"], "the backends' Service")
    assert selects["metadata"]["name"] == backend["metadata"]["name"]
    name = re.escape(backend["metadata"]["name"])
    ordinals = []
    for upstream in served.settings.upstreams:
        url = urlsplit(upstream.url)
        assert url.scheme == "http" and url.port == backend_port, upstream.url
        pod, _, domain = (url.hostname or "").partition(".")
        assert domain == service["metadata"]["name"], upstream.url
        found = re.fullmatch(rf"{name}-(\d+)", pod)
        assert found is not None, upstream.url
        ordinals.append(int(found[1]))
    assert sorted(ordinals) == list(range(backend["spec"]["replicas"]))


def test_the_redis_url_reaches_the_redis_pods() -> None:
    """OBLETH_REDIS_URL names the Redis Service and its port, which leads to the port
    Redis listens on (its default, 6379: the container sets no other)."""
    served = running(gateway())
    assert served.settings is not None and served.settings.redis_url is not None
    url = urlsplit(served.settings.redis_url)
    service = the("Service", url.hostname or "")
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == url.port]
    redis = the_selected(service["spec"]["selector"], "Service redis")
    spec = only_container(redis)
    assert container_port(spec, port["targetPort"]) == 6379
    assert "--port" not in spec.get("args", [])
    assert spec["image"].startswith("redis:")


def test_no_pod_gets_variables_for_the_namespaces_services() -> None:
    """Kubernetes sets ``OBLETH_SERVICE_HOST``, ``OBLETH_PORT_8000_TCP_ADDR`` ... in every
    pod for the Service named ``obleth``; the pods find Services by DNS and want none of
    them (the gateway leaves such names alone, but a plugin's namespace might not)."""
    for workload in workloads():
        pod = workload["spec"]["template"]["spec"]
        assert pod["enableServiceLinks"] is False, workload["metadata"]["name"]


def test_every_pod_runs_unprivileged_within_bounded_resources() -> None:
    """Every pod meets the `restricted` Pod Security level its namespace enforces
    (non-root, no privilege escalation, no capabilities, the runtime's seccomp profile),
    with a read-only root file system and CPU and memory requests and limits; obleth's
    pods run as the image's own user."""
    namespace = documents("Namespace")[0]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    image_user = re.search(r"^USER (\d+)", (CONTRIB / "Dockerfile").read_text(), re.MULTILINE)
    assert image_user is not None, "contrib/Dockerfile sets no numeric USER"
    for workload in workloads():
        name = workload["metadata"]["name"]
        pod = workload["spec"]["template"]["spec"]
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] > 0, name
        assert security["seccompProfile"]["type"] == "RuntimeDefault", name
        assert pod["automountServiceAccountToken"] is False, name
        spec = only_container(workload)
        if spec["image"].startswith("ghcr.io/obleth/obleth:"):
            assert security["runAsUser"] == int(image_user[1]), name
        context = spec["securityContext"]
        assert context["allowPrivilegeEscalation"] is False, name
        assert context["readOnlyRootFilesystem"] is True, name
        assert context["capabilities"]["drop"] == ["ALL"], name
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= spec["resources"][bound].keys(), (name, bound)


def test_a_stopping_gateway_pod_has_time_to_finish_its_streams() -> None:
    """Kubernetes kills a stopping pod after its grace period: that leaves room for the
    preStop pause and obleth serve's own graceful shutdown of streams in progress; a
    rollout never takes a pod away before its successor is ready."""
    pod = gateway()["spec"]["template"]["spec"]
    pause = only_container(gateway())["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > int(pause[1]) + GRACEFUL_S
    assert gateway()["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
