"""``k8s/``: every overlay renders (``kubectl kustomize``) and every object validates
against the Kubernetes API schemas (``kubernetes-validate``, strict: an unknown field is an
error), and the pieces fit together as the gateway needs them."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import kubernetes_validate
import pytest
import yaml

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
