"""``k8s/``: every overlay renders (``kubectl kustomize``) and every object validates
against the Kubernetes API schemas (``kubernetes-validate``, strict: an unknown field is an
error), and the pieces fit together as the gateway needs them."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.app import create_app
from gateway.config import Settings
from tests.stack import ROOT

KUBERNETES = "1.32.0"


def render(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed to render k8s/ (make installs it)"
    rendered = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "k8s" / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_every_object_of_the_overlay_is_valid(overlay: str) -> None:
    objects = render(overlay)
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {
        ("Deployment", "gateway"),
        ("HorizontalPodAutoscaler", "gateway"),
        ("PodDisruptionBudget", "gateway"),
        ("Deployment", "triton"),
        ("Service", "triton-headless"),
        ("StatefulSet", "redis"),
        ("Ingress", "gateway"),
    } <= kinds


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_the_pieces_fit_together(overlay: str) -> None:
    objects = render(overlay)
    config = find(objects, "ConfigMap", "gateway-config")["data"]
    gateway = find(objects, "Deployment", "gateway")["spec"]["template"]["spec"]
    container = gateway["containers"][0]
    # The gateway resolves the headless Service to every Triton pod.
    headless = find(objects, "Service", "triton-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert config["GATEWAY_TRITON_URL"] == "dns:///triton-headless:8001"
    assert config["GATEWAY_REDIS_URL"].startswith("redis://redis:")
    # Probes on the gateway's endpoints; the pod outlives its drain.
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    drain = float(config["GATEWAY_DRAIN_TIMEOUT_S"])
    assert gateway["terminationGracePeriodSeconds"] > pre_stop + drain
    # What /health/ready waits for is what Triton loads.
    triton = find(objects, "Deployment", "triton")["spec"]["template"]["spec"]["containers"][0]
    loads = next(e["value"] for e in triton["env"] if e["name"] == "TRITON_MODELS")
    assert loads == config["GATEWAY_MODELS"]
    assert container["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "gateway-admin"
    gpus = triton["resources"]["limits"].get("nvidia.com/gpu")
    assert gpus == (1 if overlay == "gpu" else None)
    ingress = find(objects, "Ingress", "gateway")["metadata"]["annotations"]
    assert ingress["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    # Redis refuses writes when full (the gateway's 503 store_full) before the kubelet
    # kills it for passing its memory limit, and never evicts keys or limits.
    redis = find(objects, "StatefulSet", "redis")["spec"]["template"]["spec"]["containers"][0]
    args = redis["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    maxmemory = args[args.index("--maxmemory") + 1]
    assert maxmemory.endswith("mb") and redis["resources"]["limits"]["memory"].endswith("Gi")
    assert int(maxmemory[:-2]) < 1024 * int(redis["resources"]["limits"]["memory"][:-2])


def _routed(paths: list[dict[str, Any]], path: str) -> bool:
    """Whether an Ingress rule's ``paths`` send a request for ``path`` to a backend, as
    Kubernetes defines the match: Exact, the whole path; Prefix, whole path elements."""
    for entry in paths:
        if entry["pathType"] == "Exact":
            if path == entry["path"]:
                return True
        elif path == entry["path"] or path.startswith(entry["path"].rstrip("/") + "/"):
            return True
    return False


def test_the_ingress_routes_the_public_paths_but_not_metrics() -> None:
    [rule] = find(render("cpu"), "Ingress", "gateway")["spec"]["rules"]
    paths = rule["http"]["paths"]
    assert {p["backend"]["service"]["name"] for p in paths} == {"gateway"}
    # Prometheus scrapes the pods themselves; from outside, /metrics is the ingress's 404.
    for hidden in ("/metrics", "/metrics/", "/metrics/anything"):
        assert not _routed(paths, hidden), hidden
    # Everything else the gateway serves stays reachable: every route in its OpenAPI
    # schema, and the pages it leaves out of it.
    schema = create_app(Settings(_env_file=None)).openapi()["paths"]  # type: ignore[call-arg]
    assert "/metrics" in schema
    public = {re.sub(r"\{[^}]*\}", "x", path) for path in schema} - {"/metrics"}
    public |= {"/", "/playground", "/playground/assets/app.js", "/docs", "/openapi.json"}
    assert {"/v1/chat/completions", "/admin/keys", "/health/ready"} <= public
    assert [path for path in sorted(public) if not _routed(paths, path)] == []
