"""``k8s/``: every overlay renders (``kubectl kustomize``) and every object validates
against the Kubernetes API schemas (``kubernetes-validate``, strict: an unknown field is an
error), and the pieces fit together as the gateway needs them: Redis asks for the password
of a Secret and the gateway's URL carries it (both run here, as rendered), the
NetworkPolicies let in only who needs each port, and the gateway takes X-Forwarded-For only
from the ingress's range."""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import re
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import redis
import yaml
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from gateway.app import create_app
from gateway.config import Settings
from gateway.stack.server import create_server
from tests.support.deployed_redis import (
    REFUSED,
    gateway_writes,
    local_url,
    running,
    start_fails,
    with_image_entrypoint,
)
from tests.support.redis_server import ONE_TRY
from tests.support.stack import ROOT

KUBERNETES = "1.32.0"


#: The Secrets a cluster makes before applying an overlay (k8s/base/kustomization.yaml).
SECRETS = {
    ("gateway-admin", "GATEWAY_ADMIN_KEY"): secrets.token_hex(32),
    ("gateway-redis", "REDIS_PASSWORD"): secrets.token_hex(32),
}


@functools.cache
def _kustomize(overlay: str) -> str:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed to render k8s/ (make installs it)"
    return subprocess.run(
        [kubectl, "kustomize", str(ROOT / "k8s" / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def render(overlay: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(_kustomize(overlay)) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def pod_env(
    objects: list[dict[str, Any]],
    container: dict[str, Any],
    values: dict[tuple[str, str], str] = SECRETS,
) -> dict[str, str]:
    """The environment the kubelet gives ``container``: its ConfigMaps, then its ``env`` in
    order (Secrets' keys from ``values``), ``$(NAME)`` replaced by a variable defined
    before it (``$$`` is a ``$``; an unknown name stays as written)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(find(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    for entry in container.get("env", []):
        if "valueFrom" in entry:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = values[ref["name"], ref["key"]]
        else:
            env[entry["name"]] = re.sub(
                r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]),
                entry["value"],
            )
    return env


def only_container(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [container] = find(objects, kind, name)["spec"]["template"]["spec"]["containers"]
    return dict(container)


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
        ("NetworkPolicy", "gateway"),
        ("NetworkPolicy", "triton"),
        ("NetworkPolicy", "redis"),
    } <= kinds
    # Secrets are made by each cluster (kubectl create secret), never shipped with a value.
    assert "Secret" not in {kind for kind, _ in kinds}


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
    # The Redis URL is the Deployment's (it carries a Secret), not the ConfigMap's, which
    # would lose to it anyway.
    assert "GATEWAY_REDIS_URL" not in config
    assert pod_env(objects, container)["GATEWAY_REDIS_URL"].startswith(
        f"redis://:{SECRETS['gateway-redis', 'REDIS_PASSWORD']}@redis:6379/"
    )
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


def test_redis_asks_for_the_secret_password_and_the_gateway_sends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = render("cpu")
    server = only_container(objects, "StatefulSet", "redis")
    server_env = with_image_entrypoint(pod_env(objects, server), tmp_path)
    gateway_env = pod_env(objects, only_container(objects, "Deployment", "gateway"))
    with running([*server["command"], *server["args"]], server_env, tmp_path) as started:
        # Any other pod (were it let through the NetworkPolicy) can neither read nor write.
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=started.port, retry=ONE_TRY).set("gw:key:{x}", '{"role": "admin"}')
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=started.port, password=secrets.token_hex(32), retry=ONE_TRY).ping()
        # The gateway, configured by its pod's environment, reaches it and writes.
        for name, value in gateway_env.items():
            monkeypatch.setenv(name, value)
        url = Settings(_env_file=None).redis_url  # type: ignore[call-arg]
        asyncio.run(gateway_writes(local_url(url, "redis", started.port)))
        # The readiness probe (redis-cli, in the container's environment) still passes.
        probe = server["readinessProbe"]["exec"]["command"]
        answer = subprocess.run(
            [probe[0], "-p", str(started.port), *probe[1:]],
            env=server_env,
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert answer.stdout.strip() == "PONG", answer


@pytest.mark.parametrize(
    "password",
    [
        "",  # a Secret without the key's value: Redis would run with no password
        "0123456789abcde",  # too short
        "change-this-to-the-output-of-openssl-rand-hex-32",  # a placeholder
        "p@ss/w0rd#0123456789",  # would break the gateway's URL
    ],
)
def test_redis_does_not_start_without_a_fit_password(password: str, tmp_path: Path) -> None:
    objects = render("cpu")
    server = only_container(objects, "StatefulSet", "redis")
    env = pod_env(objects, server, {**SECRETS, ("gateway-redis", "REDIS_PASSWORD"): password})
    env = with_image_entrypoint(env, tmp_path)
    assert start_fails([*server["command"], *server["args"]], env, tmp_path) == REFUSED


# Who connects from where, as the NetworkPolicies see them: the app's pods (namespace "app",
# where the overlay is applied), the ingress controller and Prometheus where the policies
# expect them, and pods that must get nowhere.
OUTSIDE = {
    "ingress controller": (
        "ingress-nginx",
        {"app.kubernetes.io/name": "ingress-nginx", "app.kubernetes.io/component": "controller"},
    ),
    "prometheus": ("monitoring", {"app.kubernetes.io/name": "prometheus"}),
    "another pod of the namespace": ("app", {"app.kubernetes.io/name": "debug"}),
    "a pod of another namespace labelled as the gateway": (
        "tenant",
        {"app.kubernetes.io/name": "gateway"},
    ),
    "a pod of another namespace labelled as Prometheus": (
        "tenant",
        {"app.kubernetes.io/name": "prometheus"},
    ),
}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector's verdict ({} selects all)."""
    assert set(selector) <= {"matchLabels"}, "only matchLabels here: teach _selects the rest"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _admits(peer: dict[str, Any], namespace: str, labels: dict[str, str]) -> bool:
    """Whether one ``from`` entry of a policy in namespace "app" admits a pod."""
    assert "ipBlock" not in peer, "an ipBlock would let in whoever has those addresses"
    if "namespaceSelector" in peer:
        namespace_labels = {"kubernetes.io/metadata.name": namespace}
        if not _selects(peer["namespaceSelector"], namespace_labels):
            return False
    elif namespace != "app":  # a podSelector alone: pods of the policy's namespace
        return False
    return _selects(peer.get("podSelector", {}), labels)


def reachable(objects: list[dict[str, Any]]) -> set[tuple[str, str, int]]:
    """(source, workload, port) for every port of every workload of the render that each
    source may connect to, by the NetworkPolicies' rules."""
    workloads = {
        o["metadata"]["name"]: o["spec"]["template"]
        for o in objects
        if o["kind"] in ("Deployment", "StatefulSet")
    }
    sources = {
        **{name: ("app", t["metadata"]["labels"]) for name, t in workloads.items()},
        **OUTSIDE,
    }
    policies = [o["spec"] for o in objects if o["kind"] == "NetworkPolicy"]
    allowed = set()
    for name, template in workloads.items():
        labels = template["metadata"]["labels"]
        ports = {
            p["name"]: p["containerPort"]
            for c in template["spec"]["containers"]
            for p in c.get("ports", [])
        }
        isolating = [
            p
            for p in policies
            if "Ingress" in p["policyTypes"] and _selects(p["podSelector"], labels)
        ]
        # A pod no policy selects takes every connection: none may be left so.
        assert isolating, f"no NetworkPolicy selects the pods of {name}"
        for rule in (rule for policy in isolating for rule in policy.get("ingress", [])):
            rule_ports = {ports.get(p["port"], p["port"]) for p in rule.get("ports", [])}
            assert {p.get("protocol", "TCP") for p in rule.get("ports", [])} <= {"TCP"}
            for source, (namespace, source_labels) in sources.items():
                if "from" in rule and not any(
                    _admits(peer, namespace, source_labels) for peer in rule["from"]
                ):
                    continue
                for port in rule_ports or set(ports.values()):
                    allowed.add((source, name, int(port)))
    return allowed


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_only_the_gateways_reach_redis_and_triton(overlay: str) -> None:
    # The ingress controller reaches the gateways; Prometheus the gateways' /metrics
    # (their only port) and Triton's metrics port; the gateways Redis and Triton's gRPC
    # (inference and model control). Triton's HTTP port (model control too) serves only
    # the kubelet's probes, which come from the node, always let in.
    assert reachable(render(overlay)) == {
        ("ingress controller", "gateway", 8080),
        ("prometheus", "gateway", 8080),
        ("prometheus", "triton", 8002),
        ("gateway", "redis", 6379),
        ("gateway", "triton", 8001),
    }


def _client_seen(trusted: str, peer: str, forwarded_for: str) -> str:
    """The client address the gateway's server (uvicorn's proxy headers middleware, with
    ``trusted`` as FORWARDED_ALLOW_IPS) records for a connection from ``peer``."""
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["client"][0])

    scope = {
        "type": "http",
        "scheme": "http",
        "client": (peer, 41000),
        "headers": [(b"x-forwarded-for", forwarded_for.encode())],
    }
    asyncio.run(ProxyHeadersMiddleware(app, trusted_hosts=trusted)(scope, None, None))  # type: ignore[arg-type]
    return seen[0]


def test_the_gateway_takes_forwarded_addresses_from_the_ingress_range_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = render("cpu")
    for name, value in pod_env(objects, only_container(objects, "Deployment", "gateway")).items():
        monkeypatch.setenv(name, value)
    # What the replica's uvicorn is given: the pod's FORWARDED_ALLOW_IPS.
    trusted = create_server(Settings(_env_file=None)).config.forwarded_allow_ips  # type: ignore[call-arg]
    assert isinstance(trusted, str)
    entries = [entry.strip() for entry in trusted.split(",")]
    assert "*" not in entries
    # uvicorn takes an entry it cannot parse for a name and says nothing: each must be an
    # address or a range.
    networks = [ipaddress.ip_network(entry) for entry in entries]
    ingress = str(next(networks[0].hosts()))
    elsewhere = next(
        address
        for address in ("192.168.77.7", "172.31.77.7", "10.99.77.7", "100.64.77.7")
        if not any(ipaddress.ip_address(address) in network for network in networks)
    )
    client = "198.51.100.23"
    # Through the ingress: the client's address (ingress-nginx sends it alone by default;
    # when it appends to what the client sent, the last address not of the range).
    assert _client_seen(trusted, ingress, client) == client
    assert _client_seen(trusted, ingress, f"203.0.113.9, {client}") == client
    # From any other pod that reaches a gateway, a made-up header is ignored: the audit
    # log records that pod's own address.
    assert _client_seen(trusted, elsewhere, "203.0.113.9") == elsewhere
