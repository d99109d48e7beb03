"""The Kubernetes kit in config/kubernetes/: every manifest is valid against the Kubernetes
API's own schema (strict: unknown fields are errors), offline; the pieces refer to each
other correctly; the ConfigMap carries config/production.yaml unchanged; the probes and the
shutdown budget agree with what the gateway does.

Run as a script, it rewrites configmap.yaml from config/production.yaml.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
KIT = ROOT / "config" / "kubernetes"
#: The Kubernetes release whose schema the manifests are checked against.
KUBERNETES_VERSION = "1.33.0"
CONFIGMAP_HEADER = (
    "# config/production.yaml as a ConfigMap, mounted at /etc/triogate. Held equal to that\n"
    "# file by tests/unit/deploy/test_kubernetes.py: edit the file, then regenerate this one\n"
    "# with `python3 tests/unit/deploy/test_kubernetes.py`.\n"
)


def configmap_text() -> str:
    """configmap.yaml as it must read: production.yaml verbatim in a literal block."""
    body = (ROOT / "config" / "production.yaml").read_text()
    indented = "".join(f"    {line}" if line.strip() else line
                       for line in body.splitlines(keepends=True))
    return (CONFIGMAP_HEADER + "apiVersion: v1\nkind: ConfigMap\nmetadata:\n"
            "  name: triogate-config\ndata:\n  production.yaml: |\n" + indented)


def manifests() -> dict[str, dict[str, Any]]:
    """Every resource in the kit, by file name (one document per file)."""
    found = {}
    for path in sorted(KIT.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        (doc,) = list(yaml.safe_load_all(path.read_text()))
        found[path.name] = doc
    return found


def by_kind(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in manifests().values() if d["kind"] == kind]
    return doc


@pytest.mark.parametrize("name", sorted(manifests()))
def test_every_manifest_is_valid_against_the_kubernetes_schema(name: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    doc = manifests()[name]
    # strict: a misspelt or misplaced field is an error, not silently ignored.
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_validator_refuses_a_misplaced_field() -> None:
    """The check above can fail: a field Kubernetes does not know is refused."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    doc = by_kind("Deployment")
    doc["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_kustomization_applies_every_resource_but_the_secret() -> None:
    kustomization = yaml.safe_load((KIT / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert listed == set(manifests()) - {"secret.example.yaml"}


def test_the_configmap_carries_production_yaml_unchanged() -> None:
    assert (KIT / "configmap.yaml").read_text() == configmap_text()
    data = by_kind("ConfigMap")["data"]["production.yaml"]
    assert data == (ROOT / "config" / "production.yaml").read_text()


def test_the_pieces_refer_to_each_other() -> None:
    deployment = by_kind("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for kind in ("Service", "PodDisruptionBudget"):
        spec = by_kind(kind)["spec"]
        selector = spec["selector"].get("matchLabels", spec["selector"])
        assert selector.items() <= labels.items(), kind
    hpa = by_kind("HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["minReplicas"] >= 2, "a PDB of maxUnavailable 1 needs two pods to drain one"
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["envFrom"][0]["secretRef"]["name"] == by_kind("Secret")["metadata"]["name"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == by_kind("ConfigMap")["metadata"]["name"]
    mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert f"{mount['config']}/production.yaml" in container["args"][1]
    service_port = by_kind("Service")["spec"]["ports"][0]
    assert service_port["targetPort"] == container["ports"][0]["name"]


def test_secret_names_every_variable_production_yaml_reads() -> None:
    text = (ROOT / "config" / "production.yaml").read_text()
    wanted = {word.split("os.environ/")[1].strip().rstrip("}") for word in text.split()
              if word.startswith("os.environ/")}
    assert wanted <= set(by_kind("Secret")["stringData"])


def test_probes_use_the_health_routes_and_shutdown_fits_the_grace_period() -> None:
    from triogate.config import load_config

    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/liveliness"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/readiness"
    environ = {name: "x" for name in by_kind("Secret")["stringData"]}
    environ["TRIOGATE_REDIS_URL"] = "redis://redis:6379/0"
    environ["TRIOGATE_DATABASE_URL"] = "postgresql://u:p@db:5432/triogate"
    environ["TRIOGATE_MASTER_KEY"] = "sk-kubernetes-test"
    settings = load_config(ROOT / "config" / "production.yaml", environ=environ).settings
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    # preStop, then in-flight requests for shutdown_grace_s, then the drain (bounded by the
    # post-call deadline and the spend-log writer's flush): all inside the grace period.
    budget = pre_stop + settings.shutdown_grace_s + 10
    assert pod["terminationGracePeriodSeconds"] >= budget


if __name__ == "__main__":
    (KIT / "configmap.yaml").write_text(configmap_text())
    sys.exit(0)
