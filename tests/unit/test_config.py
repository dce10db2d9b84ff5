"""Settings from GATEWAY_* environment variables."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from gateway import cli
from gateway.config import Settings
from gateway.stack.replicas import settings_env


def settings() -> Settings:
    return Settings(_env_file=None)  # type: ignore[call-arg]


def test_models_take_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_MODELS", "a, b")
    assert settings().models == ["a", "b"]


@pytest.mark.parametrize(
    ("value", "models"),
    [("single", ["single"]), ("a,,b, ", ["a", "b"]), ("  x  ,y", ["x", "y"]), ("", [])],
)
def test_models_list_forms(monkeypatch: pytest.MonkeyPatch, value: str, models: list[str]) -> None:
    monkeypatch.setenv("GATEWAY_MODELS", value)
    assert settings().models == models


def test_models_as_a_python_list() -> None:
    assert Settings(_env_file=None, models=["x", "y"]).models == ["x", "y"]  # type: ignore[call-arg]


def test_defaults() -> None:
    current = settings()
    assert current.models == ["smollm2", "mock_chat", "piper_tts", "whisper_stt", "e5_small"]
    assert current.model_cache_ttl_s == 5.0
    assert current.default_chat_template is None  # no format is guessed
    assert current.triton_url == "127.0.0.1:8001"


def test_scalar_fields_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_MODEL_CACHE_TTL_S", "0.5")
    monkeypatch.setenv("GATEWAY_PORT", "9090")
    monkeypatch.setenv("GATEWAY_TRITON_URL", "triton:8001")
    monkeypatch.setenv("GATEWAY_EMBEDDED_TRITON", "false")
    current = settings()
    assert current.model_cache_ttl_s == 0.5
    assert current.port == 9090
    assert current.triton_url == "triton:8001"
    assert current.embedded_triton is False


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GATEWAY_MODEL_CACHE_TTL_S", "-1"),
        ("GATEWAY_PORT", "70000"),
        ("GATEWAY_TRITON_TIMEOUT_S", "0"),
    ],
)
def test_invalid_values_are_rejected(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        settings()


def test_a_refused_admin_key_is_never_echoed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    weak = "hunter2-hunter2-hunter2-hunter2-hunter2"
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", weak)
    with pytest.raises(ValidationError) as refused:
        settings()
    assert "GATEWAY_ADMIN_KEY is refused" in str(refused.value)
    assert "hunter2" not in str(refused.value)
    # The command says which setting is refused and why, never its value.
    assert cli.main(["keys", "list"]) == 2
    printed = capsys.readouterr().err
    assert "GATEWAY_ADMIN_KEY" in printed and "too easy to guess" in printed
    assert "hunter2" not in printed


def test_env_file_is_read(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("GATEWAY_MODELS=m1,m2\nGATEWAY_LOG_LEVEL=debug\n")
    current = Settings(_env_file=env_file)  # type: ignore[call-arg]
    assert current.models == ["m1", "m2"]
    assert current.log_level == "debug"


def test_a_misspelt_env_file_line_or_keyword_is_refused_not_ignored(tmp_path) -> None:
    env_file = tmp_path / ".env"
    # Another program's variables may share the file: they are not the gateway's to read.
    env_file.write_text("OTHER_APP_TOKEN=x\nGATEWAY_MAX_REQUEST_MB=2\n")
    assert Settings(_env_file=env_file).max_request_mb == 2  # type: ignore[call-arg]
    env_file.write_text("OTHER_APP_TOKEN=x\nGATEWAY_MAX_REQEST_MB=2\n")
    with pytest.raises(ValidationError, match="max_reqest_mb"):
        Settings(_env_file=env_file)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="max_reqest_mb"):
        Settings(_env_file=None, max_reqest_mb=2)  # type: ignore[call-arg]


def test_a_misspelt_variable_is_refused_not_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_MAX_REQEST_MB", "1")
    with pytest.raises(ValidationError, match="GATEWAY_MAX_REQEST_MB: not a setting"):
        Settings(_env_file=None)  # type: ignore[call-arg]
    monkeypatch.delenv("GATEWAY_MAX_REQEST_MB")
    monkeypatch.setenv("GATEWAY_MAX_REQUEST_MB", "1")
    monkeypatch.setenv("GATEWAY_TOKENIZERS__LLAMA", "/tokenizers/llama")  # a nested one
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.max_request_mb == 1


def test_gateway_up_hands_every_setting_to_its_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gateway up`` rebuilds its settings in each replica from ``GATEWAY_*`` variables:
    nested ones (prices per model) too."""
    prices = '{"*": {"input": 1, "output": 2}, "smollm2": {"input": 0.1, "output": 0.4}}'
    monkeypatch.setenv("GATEWAY_PRICES", prices)
    monkeypatch.setenv("GATEWAY_MODELS", "smollm2,mock_chat")
    settings = Settings()
    for name in [n for n in os.environ if n.startswith("GATEWAY_")]:
        monkeypatch.delenv(name)
    for name, value in settings_env(settings).items():
        monkeypatch.setenv(name, value)
    assert Settings() == settings
    assert Settings().prices["smollm2"].output == 0.4
