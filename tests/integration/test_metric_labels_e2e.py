"""Made-up model names never become metric series, on the real stack: an attacker's key
sends a 20 KB model name on every path that refuses a request after the key named its
model (an unsupported parameter, a priority the key may not take, ``verbosity``, an audio
file over the limit, a model that does not exist); ``/metrics`` never shows the name and
does not grow with such requests, and the replicas' multiprocess files (which outlive a
replica) never hold it."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from tests.support.audio import silence, wav_bytes
from tests.support.shared_stack import UPLOAD_LIMIT_MB
from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

#: 20 KB, as the issue's attacker sent.
NAME = "attacker-" + "z" * 20_000
HI = [{"role": "user", "content": "hi"}]


def _metrics(stack: GatewayProcess) -> str:
    answer = httpx.get(stack.internal_url + "/metrics", headers=stack.headers, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.text


def _series(text: str) -> set[str]:
    """Every series' name and labels (not its value): what costs memory per series."""
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line and line[0] != "#"}


def _refused(stack: GatewayProcess, key: str, bound_key: str, name: str, audio: bytes) -> None:
    """``name`` as the model on each refusal path, through nginx with the official SDK."""
    client, bound = stack.client(key), stack.client(bound_key)
    attempts = [
        (openai.BadRequestError, lambda: client.chat.completions.create(
            model=name, messages=HI, logit_bias={"1": 1})),
        (openai.BadRequestError, lambda: client.chat.completions.create(
            model=name, messages=HI, verbosity="low")),
        (openai.BadRequestError, lambda: bound.chat.completions.create(
            model=name, messages=HI, extra_body={"priority": 0})),
        (openai.APIStatusError, lambda: client.audio.transcriptions.create(
            model=name, file=("big.wav", audio))),
        (openai.NotFoundError, lambda: client.chat.completions.create(
            model=name, messages=HI)),
    ]  # fmt: skip
    for error, attempt in attempts:
        with pytest.raises(error) as refused:
            attempt()
        if error is openai.APIStatusError:
            assert refused.value.status_code == 413


def test_a_made_up_model_on_every_refusal_path_is_never_a_series(
    stack: GatewayProcess,
) -> None:
    user = stack.create_key("labels")["key"]
    bound = stack.create_key("labels-priority", priority=5)["key"]
    # Over the upload limit, under the body limit: refused once the model was named.
    audio = wav_bytes(silence(UPLOAD_LIMIT_MB * 1024 * 1024 / 48_000 + 1))
    assert UPLOAD_LIMIT_MB * 1024 * 1024 < len(audio) < (UPLOAD_LIMIT_MB + 0.5) * 1024 * 1024
    # Once first (its series, under "unknown", exist from then on), then measured.
    _refused(stack, user, bound, NAME, audio)
    before = _metrics(stack)
    for n in range(3):
        _refused(stack, user, bound, f"{NAME}-{n}", audio)
    after = _metrics(stack)
    for text in (before, after):
        assert "z" * 64 not in text
    for status in ("400", "413"):
        assert re.search(
            rf'gateway_requests_total{{model="unknown",[^}}]*status="{status}"}}', after
        )
    assert 'gateway_requests_total{model="",route="/v1/chat/completions",status="404"}' in after
    # No new series (but /metrics' own, counted as it is read); a few bytes of counts.
    assert {s for s in _series(after) - _series(before) if "/metrics" not in s} == set()
    assert len(after) - len(before) < 2_000  # three 20 KB names: 60 KB per series
    # The replicas' sample files (PROMETHEUS_MULTIPROC_DIR) never held the name.
    files = list((stack.run_dir / f"gateway-{stack.port}" / "metrics").glob("*.db"))
    assert files
    assert not any(b"z" * 64 in path.read_bytes() for path in files)


def test_a_real_models_name_stays_its_label_when_refused(stack: GatewayProcess) -> None:
    for address in stack.replica_addresses():  # each replica, once it served the model
        replica = openai.OpenAI(
            base_url=f"http://{address}/v1", api_key=stack.admin_key, max_retries=0
        )
        replica.chat.completions.create(model="mock_chat", messages=HI, max_tokens=2)
        with pytest.raises(openai.BadRequestError):
            replica.chat.completions.create(model="mock_chat", messages=HI, logit_bias={"1": 1})
    found = re.search(
        r'gateway_requests_total{model="mock_chat",route="/v1/chat/completions",status="400"} '
        r"(\S+)",
        _metrics(stack),
    )
    assert found and float(found.group(1)) >= 2
