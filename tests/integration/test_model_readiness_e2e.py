"""A broken model beside a ready stack, on the real Triton: a model whose load fails (its
``initialize`` raises) makes Triton's own readiness false (its strict mode, the default),
yet every gateway replica stays ready (``/health/ready`` 200, so neither nginx nor
Kubernetes takes it out), the models that serve go on serving, ``/admin/models`` shows the
failure and Triton's reason, ``/v1/models`` lists only what serves, and
``gateway_model_ready`` says which is which.

The stack is its own (a few seconds): Triton over a repository made for the test, with
``mock_chat`` (linked from ``triton_repo/``) and the broken model, which must not sit in
``triton_repo/`` (``make run`` would try it). Triton keeps a failed model failed until a
load succeeds, so the shared stack's Triton is left alone."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.stack import processes
from gateway.stack.triton_server import EmbeddedTriton, free_port
from tests.support.stack import ROOT, GatewayProcess

pytestmark = pytest.mark.integration

REPOSITORY = ROOT / "triton_repo"
BROKEN_CONFIG = """name: "broken"
backend: "python"
max_batch_size: 0
input [ { name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "text_output", data_type: TYPE_STRING, dims: [ -1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
parameters [ { key: "openai_task", value: { string_value: "chat" } } ]
"""
BROKEN_MODEL = """class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("the weights of broken are missing")
"""


def repository(folder: Path) -> Path:
    """``mock_chat`` and the modules it imports, linked from ``triton_repo/``, beside a
    model whose ``initialize`` raises."""
    folder.mkdir()
    (folder / "mock_chat").symlink_to(REPOSITORY / "mock_chat")
    for module in REPOSITORY.glob("*.py"):  # mock_chat imports from its repository's root
        (folder / module.name).symlink_to(module)
    (folder / "broken" / "1").mkdir(parents=True)
    (folder / "broken" / "config.pbtxt").write_text(BROKEN_CONFIG)
    (folder / "broken" / "1" / "model.py").write_text(BROKEN_MODEL)
    return folder


@pytest.fixture(scope="module")
def beside(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[EmbeddedTriton, GatewayProcess]]:
    work = tmp_path_factory.mktemp("readiness")
    triton = EmbeddedTriton(
        repository(work / "repository"),
        ["mock_chat"],
        work / "triton",
        grpc_port=free_port(),
        http_port=free_port(),
        metrics_port=free_port(),
    )
    triton.start()
    try:
        triton.wait_ready(120, progress=lambda _: None)
        # nginx in front of two replicas, as `gateway up` runs them.
        gateway = GatewayProcess(triton_url=triton.grpc_url, env={"GATEWAY_MODELS": "mock_chat"})
        with gateway.running():
            yield triton, gateway
    finally:  # no graceful stop needed here: quicker
        processes.stop_all([triton.process], signal.SIGKILL, 10)


def test_a_model_that_fails_to_load_takes_no_replica_out_of_rotation(
    beside: tuple[EmbeddedTriton, GatewayProcess],
) -> None:
    triton, gateway = beside
    admin = httpx.Client(base_url=gateway.base_url, headers=gateway.headers, timeout=60)
    loaded = admin.post("/admin/models/broken/load")
    assert loaded.status_code == 500, loaded.text
    assert loaded.json()["error"]["code"] == "model_load_failed"
    # What used to take every replica out: Triton's own readiness is false now.
    triton_ready = httpx.get(f"http://127.0.0.1:{triton.http_port}/v2/health/ready", timeout=5)
    assert triton_ready.status_code != 200

    for address in gateway.replica_addresses():  # each replica, not whichever nginx picks
        ready = httpx.get(f"http://{address}/health/ready", timeout=5)
        assert ready.status_code == 200, ready.text
        assert ready.json() == {"status": "ready", "models": ["mock_chat"]}
        assert "weights" not in ready.text  # the probe is open to anyone

    models = {m["id"]: m for m in admin.get("/admin/models").json()["data"]}
    assert models["broken"]["status"] == "failed"
    assert models["broken"]["state"] == "UNAVAILABLE"
    assert "the weights of broken are missing" in models["broken"]["reason"]
    assert models["mock_chat"]["status"] == "ready"

    client = gateway.client()
    assert [m.id for m in client.models.list().data] == ["mock_chat"]
    for _ in range(4):  # over both replicas
        answer = client.chat.completions.create(
            model="mock_chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert answer.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="broken", messages=[{"role": "user", "content": "hi"}])

    metrics = httpx.get(gateway.internal_url + "/metrics", headers=gateway.headers, timeout=10)
    assert 'gateway_model_ready{model="broken"} 0.0' in metrics.text
    assert 'gateway_model_ready{model="mock_chat"} 1.0' in metrics.text
