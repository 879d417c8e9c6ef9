"""deploy/k8s as kustomize renders its base and its production overlay, validated against a
pinned Kubernetes version's schemas and cross-checked with the code: each process's shutdown
deadline, as the process would read it from the environment Kubernetes gives its container, ends
before the kubelet's SIGKILL; ports, probes, annotations, selectors, privileges and images."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from common.boards import load_boards
from common.settings import Settings, load_settings
from tests.kustomize import render

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "k8s" / "base" / "rankstream.yaml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
KUBELET_MARGIN_S = 5  # at least this between the process's deadline and the SIGKILL
DEADLINE_ENV = "RANKSTREAM_SHUTDOWN_DEADLINE_S"


def documents(folder: str = "base") -> tuple[dict[str, Any], ...]:
    """The documents kustomize renders of deploy/k8s/<folder>."""
    return render(folder)


def find(kind: str, name: str, folder: str = "base") -> dict[str, Any]:
    found = [d for d in documents(folder) if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name} in deploy/k8s/{folder}"
    return found[0]


def source_data(kind: str, name: str) -> dict[str, str]:
    doc = find(kind, name)
    data = {**doc.get("data", {}), **doc.get("stringData", {})} if kind == "Secret" else doc["data"]
    return {str(k): str(v) for k, v in data.items()}


def container_env(container: dict[str, Any]) -> tuple[dict[str, str], set[str]]:
    """The environment Kubernetes builds for `container` (envFrom in order, then env, which wins),
    and the names its `env` sets one by one."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            data = source_data("ConfigMap", source["configMapRef"]["name"])
        else:
            data = source_data("Secret", source["secretRef"]["name"])
        env.update({prefix + k: v for k, v in data.items()})
    explicit = set()
    for item in container.get("env", []):
        explicit.add(item["name"])
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif "fieldRef" in item["valueFrom"]:  # the downward API: a pod's own field
            env[item["name"]] = "rankstream-worker-7d9f8-x2x4q"  # what metadata.name looks like
        else:
            ref = item["valueFrom"]
            kind = "ConfigMap" if "configMapKeyRef" in ref else "Secret"
            key_ref = ref.get("configMapKeyRef") or ref["secretKeyRef"]
            env[item["name"]] = source_data(kind, key_ref["name"])[key_ref["key"]]
    return env, explicit


@pytest.mark.parametrize(
    ("deployment", "command"), [("rankstream-worker", "worker"), ("rankstream-api", "api")]
)
def test_shutdown_deadline_ends_before_the_kubelet_kills(deployment, command):
    pod = find("Deployment", deployment)["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c.get("args") == [command]]
    env, explicit = container_env(container)
    # set on purpose for this process, next to the grace period it must fit in, not a default
    assert DEADLINE_ENV in env, f"{deployment} leaves {DEADLINE_ENV} to the default"
    assert DEADLINE_ENV in explicit or DEADLINE_ENV in source_data("ConfigMap", "rankstream")
    settings = load_settings(env)  # what the process reads: every RANKSTREAM_* name known, values valid
    assert settings.shutdown_deadline_s == float(env[DEADLINE_ENV])
    grace = pod["terminationGracePeriodSeconds"]
    assert isinstance(grace, int)
    assert settings.shutdown_deadline_s + KUBELET_MARGIN_S <= grace, (
        f"{deployment}: a {settings.shutdown_deadline_s} s deadline leaves less than {KUBELET_MARGIN_S} s "
        f"before the SIGKILL at terminationGracePeriodSeconds={grace}"
    )


@pytest.mark.parametrize(("kind", "name"), [("Job", "rankstream-topics"), ("Deployment", "rankstream-worker"),
                                            ("Deployment", "rankstream-api")])  # fmt: skip
def test_every_pod_runs_unprivileged_on_a_read_only_root(kind: str, name: str) -> None:
    pod = find(kind, name)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    user = re.search(r"^USER (\d+):(\d+)$", DOCKERFILE.read_text(encoding="utf-8"), re.M)
    assert user is not None
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (
        int(user[1]),
        int(user[2]),
    )
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}


KUBERNETES = "1.34"  # the version whose schemas the manifest is held to (kubernetes-validate)


SERVICE_MONITOR_CRD = ROOT / "tests" / "schemas" / "servicemonitors-v0.93.0.yaml"


def _strict(schema: Any) -> Any:
    """A CRD's schema as the API server's strict field validation applies it: an object with
    properties takes no other field (unless it says it keeps unknown fields)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        keeps_unknown = out.get("x-kubernetes-preserve-unknown-fields")
        if "properties" in out and "additionalProperties" not in out and not keeps_unknown:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def service_monitor_validator() -> jsonschema.Draft7Validator:
    (crd,) = [d for d in yaml.safe_load_all(SERVICE_MONITOR_CRD.read_text(encoding="utf-8")) if d]
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


@pytest.mark.parametrize("folder", ["base", "overlays/production"])
def test_every_document_is_valid_for_the_pinned_kubernetes_version(folder: str) -> None:
    monitors = service_monitor_validator()
    for doc in documents(folder):
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            assert doc["kind"] == "ServiceMonitor"
            monitors.validate(doc)  # against prometheus-operator's CRD, vendored
        else:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)  # raises on any error


def test_the_service_monitor_schema_does_refuse_a_field_it_does_not_know() -> None:
    monitor = find("ServiceMonitor", "rankstream-api", "overlays/production")
    broken = {**monitor, "spec": {**monitor["spec"], "endpoint": monitor["spec"]["endpoints"]}}
    with pytest.raises(jsonschema.ValidationError):
        service_monitor_validator().validate(broken)


def test_each_service_monitor_reaches_its_process_metrics_port() -> None:
    production = "overlays/production"
    for name, port in (("rankstream-api", "admin"), ("rankstream-worker", "probes")):
        monitor = find("ServiceMonitor", name, production)["spec"]
        services = [
            d for d in documents(production)
            if d["kind"] == "Service"
            and monitor["selector"]["matchLabels"].items() <= d["metadata"].get("labels", {}).items()
        ]  # fmt: skip
        assert len(services) == 1, name  # the public Service never: it has no admin port
        service = services[0]["spec"]
        assert service["selector"] == find("Deployment", name)["spec"]["selector"]["matchLabels"]
        assert [(p["name"], p["targetPort"]) for p in service["ports"]] == [(port, port)]
        assert [(e["port"], e["path"]) for e in monitor["endpoints"]] == [(port, "/metrics")]
        assert port in _ports("Deployment", name)


def test_the_production_overlay_keeps_every_object_and_sets_image_workers_and_resources() -> None:
    base, production = documents(), documents("overlays/production")
    objects = [(d["kind"], d["metadata"]["name"]) for d in production]
    assert set(objects) - {(d["kind"], d["metadata"]["name"]) for d in base} == {
        ("Service", "rankstream-api-admin"),  # monitoring.yaml's
        ("Service", "rankstream-worker-metrics"),
        ("ServiceMonitor", "rankstream-api"),
        ("ServiceMonitor", "rankstream-worker"),
    }
    assert len(objects) == len(base) + 4
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    images = {
        c["image"] for d in production if d["kind"] in {"Job", "Deployment"}
        for c in d["spec"]["template"]["spec"]["containers"]
    }  # fmt: skip
    assert images == {f"registry.example.com/games/rankstream:{version}"}
    assert find("Deployment", "rankstream-worker", "overlays/production")["spec"]["replicas"] == 6
    for name in ("rankstream-worker", "rankstream-api"):
        (container,) = find("Deployment", name, "overlays/production")["spec"]["template"]["spec"][
            "containers"
        ]
        assert container["resources"]["requests"]["cpu"] == "1", name
        # what the patch leaves alone is the base's
        (kept,) = find("Deployment", name)["spec"]["template"]["spec"]["containers"]
        assert {k: v for k, v in container.items() if k not in {"resources", "image"}} == {
            k: v for k, v in kept.items() if k not in {"resources", "image"}
        }


def test_the_validation_does_refuse_a_field_kubernetes_does_not_know() -> None:
    doc = find("Deployment", "rankstream-api")
    broken = {**doc, "spec": {**doc["spec"], "replicaz": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_the_images_name_this_release() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    images = {
        c["image"] for d in documents() if d["kind"] in {"Job", "Deployment"}
        for c in d["spec"]["template"]["spec"]["containers"]
    }  # fmt: skip
    assert images == {f"rankstream:{version}"}


def _ports(kind: str, name: str) -> dict[str, int]:
    (container,) = find(kind, name)["spec"]["template"]["spec"]["containers"]
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def test_ports_probes_and_policies_are_the_ones_the_processes_serve() -> None:
    defaults = {name: field.default for name, field in Settings.model_fields.items()}
    assert _ports("Deployment", "rankstream-api") == {
        "http": defaults["api_port"],
        "admin": defaults["api_admin_port"],
    }
    assert _ports("Deployment", "rankstream-worker") == {"probes": defaults["worker_http_port"]}
    for name, metrics_port in (
        ("rankstream-api", "api_admin_port"),
        ("rankstream-worker", "worker_http_port"),
    ):
        pod = find("Deployment", name)["spec"]["template"]
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(defaults[metrics_port])
        (container,) = pod["spec"]["containers"]
        probes = [
            container[p]["httpGet"]
            for p in ("livenessProbe", "readinessProbe", "startupProbe")
            if p in container
        ]
        assert {p["path"] for p in probes} == {"/livez", "/readyz"}, name
        policy = find("NetworkPolicy", name)
        assert policy["spec"]["podSelector"] == find("Deployment", name)["spec"]["selector"]
        allowed = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
        assert allowed == set(_ports("Deployment", name).values()), name
        assert (
            find("PodDisruptionBudget", name)["spec"]["selector"]
            == find("Deployment", name)["spec"]["selector"]
        )
    scaled = find("HorizontalPodAutoscaler", "rankstream-api")["spec"]
    assert scaled["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "rankstream-api",
    }
    assert "replicas" not in find("Deployment", "rankstream-api")["spec"]  # the autoscaler's to set
    service = find("Service", "rankstream-api")["spec"]
    assert [p["targetPort"] for p in service["ports"]] == ["http"]  # never the admin port


@pytest.mark.parametrize(("kind", "name"), [("Job", "rankstream-topics"), ("Deployment", "rankstream-worker"),
                                            ("Deployment", "rankstream-api")])  # fmt: skip
def test_every_setting_is_known_and_the_boards_file_is_where_the_setting_says(
    kind: str, name: str, tmp_path: Path
) -> None:
    pod = find(kind, name)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env, _ = container_env(container)
    names = {n for n in env if n.isupper()}  # the ConfigMap also holds boards.yaml, a file
    settings = load_settings({n: env[n] for n in names})  # an unknown name or a bad value raises
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    if kind == "Job":  # `rankstream topics` reads no boards; it makes the topics for production
        assert (settings.topic_replication, settings.topic_min_insync_replicas) == (3, 2)
        return
    folder, file = str(settings.boards.parent), settings.boards.name
    volume = next(v for v in pod["volumes"] if v["name"] == mounts[folder])
    items = {i["path"]: i["key"] for i in volume["configMap"]["items"]}
    text = source_data("ConfigMap", volume["configMap"]["name"])[items[file]]
    boards_file = tmp_path / file
    boards_file.write_text(text, encoding="utf-8")
    assert load_boards(boards_file).hot, "the example config's hot board"  # it parses, as the process would
