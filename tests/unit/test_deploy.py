"""deploy/k8s/rankstream.yaml: each process's shutdown deadline, as the process would read it from
the environment Kubernetes gives its container, ends before the kubelet's SIGKILL."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.settings import load_settings

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "rankstream.yaml"
DOCKERFILE = MANIFEST.parents[1] / "Dockerfile"
KUBELET_MARGIN_S = 5  # at least this between the process's deadline and the SIGKILL
DEADLINE_ENV = "RANKSTREAM_SHUTDOWN_DEADLINE_S"


def documents() -> list[dict[str, Any]]:
    with MANIFEST.open(encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def find(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name} in {MANIFEST.name}"
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
