"""Gateway settings, read from ``GATEWAY_*`` environment variables (and a ``.env`` file).

Every field can be set as ``GATEWAY_<FIELD>``; lists take commas (``GATEWAY_MODELS=a,b``).
Settings are passed into :func:`gateway.app.create_app`; nothing reads them at import time.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from zxcvbn import zxcvbn

PROJECT_ROOT = Path(__file__).resolve().parent.parent

#: ChatML. Not used unless an operator sets it as ``GATEWAY_DEFAULT_CHAT_TEMPLATE``: a model
#: trained on another format (Llama 3, Mistral, Gemma) would get text it never saw.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


MIN_ADMIN_KEY_LENGTH = 32
#: How hard the admin key must be to guess, in bits (zxcvbn's estimate): a random key of 32
#: characters or more has far more; repeated, sequential or dictionary text has far less.
MIN_ADMIN_KEY_BITS = 80
_BITS_PER_DIGIT = math.log2(10)


def weak_key_problem(key: str) -> str | None:
    """Why ``key`` is too weak to be the admin key, or None. Strength is zxcvbn's estimate
    of the guesses an attacker needs (repeats, sequences, keyboard walks and dictionary
    words count for little), so a random key is accepted whatever words it happens to
    contain."""
    if len(key) < MIN_ADMIN_KEY_LENGTH:
        return f"it has {len(key)} characters; at least {MIN_ADMIN_KEY_LENGTH} are required"
    # zxcvbn takes tens of milliseconds, and settings are built again and again (each
    # replica, each CLI command, each test): its verdict is kept by the key's digest, never
    # by the key itself.
    digest = hashlib.sha256(key.encode()).digest()
    if digest not in _VERDICTS:
        if len(_VERDICTS) >= 64:
            _VERDICTS.clear()
        _VERDICTS[digest] = _guessable(key)
    return _VERDICTS[digest]


_VERDICTS: dict[bytes, str | None] = {}


def _guessable(key: str) -> str | None:
    # zxcvbn refuses long input; the first 72 characters of a strong key are strong.
    bits = zxcvbn(key[:72])["guesses_log10"] * _BITS_PER_DIGIT
    if bits < MIN_ADMIN_KEY_BITS:
        return (
            f"it is too easy to guess (about {bits:.0f} bits; at least {MIN_ADMIN_KEY_BITS} "
            "are required): use a random key, e.g. `openssl rand -hex 32`"
        )
    return None


class ModelPrice(BaseModel):
    """One model's prices in ``GATEWAY_PRICES`` (docs/budgets.md), in any one currency."""

    model_config = ConfigDict(extra="forbid")

    input: float = Field(0.0, ge=0, le=1_000_000)
    """Per million prompt tokens (rounded to a thousandth)."""
    output: float = Field(0.0, ge=0, le=1_000_000)
    """Per million generated tokens (rounded to a thousandth)."""
    audio_input: float = Field(0.0, ge=0, le=1_000_000)
    """Per minute of audio transcribed."""
    audio_output: float = Field(0.0, ge=0, le=1_000_000)
    """Per minute of audio spoken."""


class Settings(BaseSettings):
    """Configuration of the gateway and of the Triton server it may start."""

    # A refused value is never echoed in a settings error: it may be a secret (the admin
    # key, a Redis URL with its password), and the error names the setting anyway.
    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_",
        env_file=".env",
        env_nested_delimiter="__",
        # Nothing given is dropped: a setting that names no field (a keyword, a GATEWAY_*
        # line of the .env file) is refused by name; the .env file's other lines belong to
        # other programs and are not read (match_prefix).
        extra="forbid",
        dotenv_filtering="match_prefix",
        hide_input_in_errors=True,
    )

    host: str = "127.0.0.1"
    """Address the OpenAI API listens on."""
    port: int = Field(8080, ge=1, le=65535)
    """Port the OpenAI API listens on."""

    embedded_nginx: bool = True
    """``gateway up`` serves through nginx (Debian package) on ``host:port``, in front of
    ``replicas`` gateway processes. False: one gateway process serves ``host:port`` itself."""
    replicas: int = Field(2, ge=1, le=64)
    """Gateway processes behind the embedded nginx."""
    nginx_internal_port: int = Field(9090, ge=1, le=65535)
    """Loopback port of nginx's internal listener (``/metrics``, ``/nginx_status``)."""

    triton_url: str = "127.0.0.1:8001"
    """gRPC address (host:port) of Triton. With ``embedded_triton`` the server started by
    ``gateway up`` listens here. Several servers: a comma-separated list, and
    ``dns:///name:port`` for every address of a name (a Kubernetes headless Service); see
    :mod:`gateway.backend.pool`."""
    triton_check_interval_s: float = Field(1.0, gt=0)
    """With several Triton servers: how often each is asked whether it is ready and which
    models it has ready (and DNS names are resolved again)."""
    embedded_triton: bool = True
    """``gateway up`` starts Triton from the nvidia-pytriton wheel. False (or
    ``--triton-url``): use the Triton already running at ``triton_url``."""
    triton_http_port: int = Field(8000, ge=1, le=65535)
    """HTTP port of the embedded Triton (health, model control by hand)."""
    triton_metrics_port: int = Field(8002, ge=1, le=65535)
    """Prometheus metrics port of the embedded Triton."""
    model_repository: Path = PROJECT_ROOT / "triton_repo"
    """Model repository the embedded Triton serves."""
    models: Annotated[list[str], NoDecode] = [
        "smollm2",
        "mock_chat",
        "piper_tts",
        "whisper_stt",
        "e5_small",
    ]
    """Models the embedded Triton loads at start; ``/health/ready`` waits for all of them."""
    run_dir: Path = Path(".run")
    """Where the embedded Triton's logs and backend directory go."""
    triton_exit_timeout_s: int = Field(30, ge=0, le=3600)
    """``gateway up``'s Triton: how long it waits at shutdown for its models to finish what
    they run and unload (``--exit-timeout-secs``, Triton's default), before it exits anyway.
    A model that never answers a request (TensorRT-LLM's LLM API model answers no aborted
    non-streamed request) holds the stop this long."""
    triton_start_timeout_s: float = Field(300.0, gt=0)
    """How long ``gateway up`` waits for Triton and its models to become ready."""

    supervise_interval_s: float = Field(0.5, gt=0, le=60, allow_inf_nan=False)
    """How often ``gateway up`` checks that each part it started (Redis, Triton, nginx, the
    replicas) still runs."""
    restart_delay_s: float = Field(0.5, gt=0, le=60, allow_inf_nan=False)
    """``gateway up``'s wait before it starts a part that died again; it doubles with each
    death (up to 16 times this), and a part that died 5 times within 60 s ends it."""
    triton_models_check_s: float = Field(2.0, gt=0, le=60, allow_inf_nan=False)
    """How often ``gateway up`` reads which models Triton has ready (the ones it loads into a
    Triton that died and starts again)."""

    # A backend coming back (docs/operations.md#short-outages): gateway/outages.py.
    backend_wait_s: float = Field(5.0, ge=0, le=60, allow_inf_nan=False)
    """How long one request may wait, in all, for Triton or Redis while it is coming back
    (it answered this process before and went away a moment ago: a restart, a Sentinel
    failover) instead of failing at once; past it, 503 with a ``Retry-After`` from what
    the gateway knows. Part of the request's own time (a client's timeout counts it); a
    client that goes away stops its wait. 0: never wait."""
    triton_restart_s: float = Field(10.0, gt=0, le=3600, allow_inf_nan=False)
    """How long a Triton restart usually takes, until a replica has seen one end (then it
    goes by the last one it saw): how long an outage counts as "coming back" (three times
    this) and what ``Retry-After`` says. ``gateway up`` sets it for its replicas to the time
    its Triton took to start, unless it is set."""

    drain_timeout_s: float = Field(30.0, ge=0)
    """On SIGTERM a gateway process answers new requests 503 (``/health/ready`` too) and lets
    the ones in flight, streams included, run to their end for up to this long before it
    stops. Kubernetes: keep ``terminationGracePeriodSeconds`` above it."""

    model_cache_ttl_s: float = Field(5.0, ge=0)
    """How long the model list read from Triton is reused before it is read again. An unknown
    model name always triggers a fresh read, so a newly loaded model is found at once."""
    tokenizers: dict[str, Path] = {}
    """Hugging Face tokenizer files of models, mounted on the gateway: model name -> a
    tokenizer directory or its ``tokenizer_config.json`` (JSON in the environment:
    ``GATEWAY_TOKENIZERS='{"llama3": "/tokenizers/llama3"}'``). Their chat template and
    ``bos_token`` / ``eos_token`` render the model's prompts (unless its config has a
    ``chat_template``), and ``tokenizer.json`` counts tokens for models that report none."""
    default_chat_template: str | None = None
    """A Jinja chat template for chat models with none of their own (no ``chat_template``
    parameter, no tokenizer). Unset: ``/v1/chat/completions`` refuses such a model with a
    400 instead of guessing a format (``/v1/completions`` still serves it)."""
    default_max_tokens: int = Field(1024, ge=1)
    """``max_tokens`` sent for a request that sets none, to a model whose config gives
    neither a ``default_max_tokens`` nor a ``context_length`` (engines have their own
    default, vLLM's is 16 tokens, and TensorRT-LLM requires one)."""
    triton_timeout_s: float = Field(10.0, gt=0)
    """Timeout of Triton control calls (health, repository index, model config)."""

    max_audio_upload_mb: float = Field(25.0, gt=0)
    """Largest audio file ``/v1/audio/transcriptions`` and ``/translations`` accept (OpenAI's
    limit is 25 MB)."""

    # Files (/v1/files; docs/files.md).
    max_file_mb: float = Field(32.0, gt=0, le=4096)
    """Largest file ``POST /v1/files`` stores (MiB), counted as it is stored; a larger one is
    a 413 ``file_too_large`` and nothing of it is kept. nginx's body cap covers it plus
    1 MiB (:attr:`edge_body_mb`). Files count in their key's stored bytes
    (``stored_mb_per_key``), so that quota bounds what a key keeps in all."""
    files_dir: Path | None = None
    """Where uploaded files' bytes live: unset (the default), in Redis, in chunks of at most
    1 MiB; set, in this directory, which every replica must mount (a ReadWriteMany volume
    in Kubernetes), so that large files do not take Redis's memory. The files' records stay
    in Redis either way."""
    files_ttl_days: int = Field(30, ge=1, le=3650)
    """How long a file uploaded without ``expires_after`` is kept (days). OpenAI keeps such a
    file until it is deleted; here every file expires, so that what keys store stays
    bounded."""

    # Batches (/v1/batches; docs/batches.md).
    batch_concurrency: int = Field(4, ge=1, le=1024)
    """Batch lines each replica runs at once, per model: how fast a batch drains (two
    replicas run twice as many). They run at the lowest priority, so with a slot limit
    (``triton_max_inflight``) interactive requests go first."""
    max_batch_lines: int = Field(50_000, ge=1)
    """Requests in one batch (OpenAI's 50,000); a longer input file fails the batch."""
    max_batches_per_key: int = Field(8, ge=1)
    """Batches of one key not yet ended; one more is a 429 ``too_many_batches``."""
    batch_tick_s: float = Field(0.5, gt=0, le=10)
    """How often each replica's batch worker looks at the batches, at most (it looks again
    at once when one of its lines ends)."""
    batch_lease_s: float = Field(30.0, ge=1, le=3600)
    """How long a replica holds a batch line without renewing its lease (it renews every
    tick): how soon the lines of a replica that died go to the others. At least four
    ticks, so that a slow tick does not lose a line that runs."""

    @model_validator(mode="after")
    def _lease_outlasts_ticks(self) -> Settings:
        if self.batch_lease_s < 4 * self.batch_tick_s:
            raise ValueError(
                "GATEWAY_BATCH_LEASE_S must be at least four GATEWAY_BATCH_TICK_S "
                f"({self.batch_lease_s} < 4 x {self.batch_tick_s})"
            )
        return self

    # Images in chat (image_url parts, Responses input_image; docs/chat.md#images-image_url-parts).
    image_url_hosts: Annotated[list[str], NoDecode] = []
    """Hosts whose ``http(s)`` image URLs the gateway fetches (comma-separated host names,
    ``host:port`` to allow one port only). Empty (the default): only ``data:`` URLs are
    taken, and any other URL is a 400."""
    max_images: int = Field(8, ge=1)
    """Images in one request (every message's together)."""
    max_image_mb: float = Field(10.0, gt=0)
    """Largest image file, decoded from a data URL or fetched from an allowed host."""
    max_image_megapixels: float = Field(32.0, gt=0)
    """Largest image in pixels (width x height / 1,000,000): a small file can hold a huge
    picture, which the gateway and the model would decode whole."""
    image_fetch_timeout_s: float = Field(10.0, gt=0)
    """The longest an image URL's fetch may take, connection to last byte."""

    @field_validator("image_url_hosts", mode="before")
    @classmethod
    def _host_list(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, list):
            return [str(host).strip().lower() for host in value if str(host).strip()]
        return value

    # Bounds on what one request can make the system do (docs/limits.md). Past one, a
    # request is refused with a 400 (413 for sizes) naming the limit before work starts,
    # except where docs/limits.md says otherwise (in-flight work waits; Realtime drops its
    # oldest items).
    max_request_mb: float = Field(36.0, gt=0)
    """Largest request body the app reads (refused with 413 before it is parsed): a 25 MB
    audio file in base64 in a chat message is about 34 MB."""
    max_prompts: int = Field(128, ge=1)
    """Prompts in one ``/v1/completions`` request (a list of strings)."""
    max_choices: int = Field(128, ge=1)
    """Generations one request asks for: prompts x ``n`` (chat: ``n``)."""
    max_inflight_per_request: int = Field(16, ge=1)
    """Triton requests one request keeps in flight at once (its choices and prompts run
    this many at a time)."""
    max_audio_seconds: float = Field(1500.0, gt=0)
    """Longest decoded audio the gateway takes in one request or Realtime turn (seconds;
    a small file at a low bitrate can hold hours)."""
    max_schema_kb: int = Field(64, ge=1)
    """Largest JSON schema (``response_format``, a tool's ``parameters``) in KB of JSON."""
    max_stored_kb: int = Field(1024, ge=1)
    """Largest record the gateway stores for a request (a ``/v1/responses`` response with
    its conversation, a conversation of ``/v1/conversations``, a stored chat completion, a
    session's messages, the text a Realtime session keeps), in KB of JSON."""
    max_conversation_items: int = Field(1000, ge=20, le=100_000)
    """Items one conversation (``/v1/conversations``) holds at most; adding more is a 400
    (``too_many_items``). Its record is also bounded by ``max_stored_kb``."""
    max_stored_chat_completions: int = Field(10_000, ge=1, le=1_000_000)
    """Stored chat completions (``store: true``) one key may keep at once; past it, storing
    another is refused (403 ``storage_quota_exceeded``) until some expire or are deleted.
    It bounds what one ``GET /v1/chat/completions`` with filters reads."""
    realtime_max_buffer_mb: float = Field(15.0, gt=0)
    """Largest Realtime input audio buffer, in pcm16 bytes as the client sent them
    (OpenAI's limit is 15 MB)."""
    realtime_max_items: int = Field(256, ge=1)
    """Conversation items a Realtime session keeps; past it, the oldest are dropped (with a
    ``conversation.item.deleted`` event), as OpenAI truncates a full conversation."""
    max_decodes: int = Field(2, ge=1, le=64)
    """Audio jobs one replica holds decoded at once, whatever the requests: an upload from
    its decoding until it is transcribed, a chat request's ``input_audio`` parts until they
    are; the others wait their turn (at most ``queue_max_wait_s``, and at most
    ``queue_max_waiting`` of them, then 503 ``overloaded``). Each holds its samples once, as
    float32 at 16 kHz: 64 KB per second of audio, up to ``max_audio_seconds``."""
    max_messages: int = Field(2048, ge=1, le=1_000_000)
    """Messages (chat) or input items (Responses) in one request."""
    max_content_parts: int = Field(4096, ge=1, le=1_000_000)
    """Content parts in one request, every message's together."""
    max_tools_kb: int = Field(512, ge=1)
    """The request's ``tools`` (or legacy ``functions``) together (names, descriptions and
    schemas), in KB of JSON."""
    max_json_depth: int = Field(128, ge=8, le=512)
    """How deeply a request body's JSON may nest (objects and arrays), checked before the
    body is parsed; a tool call's ``arguments`` in the history and each Realtime client event
    are held to it too. Python's parser recurses once a level (it fails near 1,000)."""
    max_json_containers: int = Field(32_768, ge=16, le=10_000_000)
    """Objects and arrays in one request body's JSON, counted before it is parsed (each
    becomes a Python object: a 34 MB body of a million small messages would hold gigabytes
    once parsed and validated)."""
    max_json_values: int = Field(1_048_576, ge=16, le=100_000_000)
    """Values in one request body's JSON (array items and object members), counted before
    it is parsed; token arrays (embeddings, completions) are one value a token."""
    stored_mb_per_key: float = Field(32.0, ge=0)
    """What one key may keep stored in Redis (Responses with their conversation, sessions,
    spoken answers' transcripts, files of ``/v1/files`` wherever their bytes are), in MB of
    what is stored plus 512 bytes per record, until the records expire or are deleted. Past
    it, that key's storing is refused before anything is generated (403
    ``storage_quota_exceeded``) while other keys go on. 0: no quota of its own (only the
    global headroom); the bytes are still shown in ``/v1/me``."""
    stored_mb_per_project: float = Field(128.0, ge=0)
    """The same, for all the keys of one project together. 0: no quota."""
    redis_maxmemory_mb: int = Field(512, ge=16)
    """``maxmemory`` of the embedded Redis, with the ``noeviction`` policy: when full, writes
    fail with a clear 503 instead of keys or limits being evicted silently."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis holding API keys (hashed), sessions, rate-limit counters and usage. Every
    replica of the gateway points at the same one."""
    embedded_redis: bool = True
    """``gateway up`` starts ``redis-server`` (persisting under ``run_dir``) at the host and
    port of ``redis_url``. False: use the Redis already running there."""
    redis_timeout_s: float = Field(1.0, gt=0)
    """Connect and command timeout for Redis (per try; a command is tried twice): when it is
    down, requests that need it fail with 503 instead of hanging."""
    redis_max_connections: int = Field(128, ge=1)
    """Connections one replica keeps open to Redis (to each node of a Cluster). A command
    that finds them all busy waits for one up to ``redis_timeout_s``, then fails with 503
    like a Redis that does not answer."""
    admin_key: SecretStr | None = None
    """A bootstrap key with the admin role (at least 32 characters, not a placeholder).
    Unset: ``gateway up`` generates one and prints it."""
    session_ttl_s: int = Field(86_400, gt=0)
    """How long a chat session is kept after its last use (seconds)."""
    responses_ttl_s: int = Field(30 * 86_400, gt=0)
    """How long a stored ``/v1/responses`` response is kept (seconds; OpenAI keeps 30 days).
    Conversations (``/v1/conversations``) and stored chat completions are kept as long."""
    reasoning_keys: SecretStr | None = None
    """Keys that seal a reasoning model's reasoning as ``encrypted_content`` (Responses
    ``include: ["reasoning.encrypted_content"]``): comma-separated Fernet keys (32
    url-safe base64 bytes each); the first seals, every one opens, so a new key goes first
    and an old one is dropped once what it sealed is no longer sent back. Unset: one key
    derived from ``admin_key`` (every replica shares it)."""
    max_background_per_key: int = Field(8, ge=1, le=10_000)
    """Background responses (``background: true``) one key may have running at once;
    past it, 429 ``too_many_background_responses``."""
    background_lease_s: float = Field(30.0, ge=2, le=3600)
    """How long a running background response's lease lasts; its replica renews it every
    min(0.5 s, a third of this). One whose lease ran out (its replica died) reads as
    ``failed``."""
    concurrency_lease_s: float = Field(60.0, gt=0)
    """A running request holds a concurrency slot for this long and renews it while it
    runs, so a gateway that dies frees its slots after at most this long."""

    voice_chat_model: str | None = None
    """The chat model of the Realtime API when the client names none of ours (an OpenAI
    model name like ``gpt-realtime``). Unset: the first chat model of ``models`` that is
    loaded, else the first one Triton has."""
    voice_transcription_model: str | None = None
    """The model that transcribes audio in chat messages and Realtime turns. Unset: chosen
    as for ``voice_chat_model``."""
    voice_speech_model: str | None = None
    """The model that speaks audio answers (chat ``modalities: ["audio"]``, Realtime).
    Unset: chosen as for ``voice_chat_model``."""
    realtime_instructions: str = (
        "You are a helpful voice assistant. Answer in one or two short spoken sentences, "
        "in plain words."
    )
    """The instructions of a Realtime session until the client sets its own (OpenAI's
    sessions have default instructions too). Short spoken answers suit a voice."""
    realtime_temperature: float = Field(0.6, ge=0.0, le=2.0)
    """Sampling temperature of Realtime answers."""
    audio_ttl_s: int = Field(3600, gt=0)
    """How long a chat answer's audio id can be referred to (its ``expires_at``)."""
    realtime_max_message_mb: float = Field(16.0, gt=0)
    """The largest Realtime client event (an ``input_audio_buffer.append`` of 16 MB holds
    about 4 minutes of 24 kHz audio in base64)."""
    metrics_require_key: bool = False
    """``/metrics`` needs an admin key. Off by default: nginx keeps ``/metrics`` off the
    public listener, and Prometheus scrapes the replicas on the private network."""

    # Budgets and spend (docs/budgets.md)
    prices: dict[str, ModelPrice] = {}
    """Prices of models, for money budgets and the spend reports: model id -> ``input`` and
    ``output`` per million tokens, ``audio_input`` and ``audio_output`` per minute (JSON in
    the environment: ``GATEWAY_PRICES='{"smollm2": {"input": 0.1, "output": 0.4}}'``);
    ``"*"`` prices every model not listed. A model without a price is refused (403
    ``model_not_priced``) to a key or project with a money budget, and costs nothing in
    the reports."""

    log_level: str = "info"
    """Log level of the gateway (and uvicorn)."""

    # LoRA adapters (docs/fronting-triton.md#lora-adapters)
    lora_separator: str = Field(":", min_length=1, max_length=8, pattern=r"^[^\s,/]+$")
    """Between a base model's name and its LoRA adapter's in the adapter's model id
    (``base:adapter``); no whitespace, comma or slash."""

    # Monitoring and the audit log (docs/operations.md#monitoring-and-alerts,
    # docs/keys-and-admin.md#audit-log)
    redis_check_interval_s: float = Field(5.0, gt=0, le=300)
    """How often each gateway process pings Redis in the background to set its
    ``gateway_redis_up`` gauge (``/health/ready`` sets it too)."""
    audit_retention_days: float = Field(90.0, gt=0, le=3650, allow_inf_nan=False)
    """How long an entry of the admin audit log is kept (older entries are trimmed as new
    ones are written)."""
    audit_max_entries: int = Field(100_000, ge=100, le=10_000_000)
    """The most entries the audit log keeps, whatever their age (Redis memory's bound)."""
    # Traces (docs/tracing.md)
    otlp_traces_endpoint: str | None = Field(None, pattern=r"^https?://[^\s]+$")
    """The OTLP/HTTP URL (protobuf; the whole URL, ``http://collector:4318/v1/traces``) the
    gateway sends its spans to, and the embedded Triton its own. Unset: the standard
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` with
    ``/v1/traces``; none set (or ``OTEL_SDK_DISABLED=true``): no traces."""
    # Priorities, shedding and routing over Tritons (docs/scheduling.md).
    triton_max_inflight: int = Field(0, ge=0, le=100_000)
    """Requests one replica keeps in flight per model and per Triton server; the rest wait
    in the replica's queue for the model, by priority then arrival. 0 (the default): no
    limit and no queue, every request goes to Triton at once."""
    queue_max_waiting: int = Field(256, ge=1, le=100_000)
    """Requests waiting per model in one replica (with ``triton_max_inflight``); past it,
    the worst-ranked request is refused with 503 ``overloaded``."""
    queue_max_wait_s: float = Field(30.0, gt=0, le=3600, allow_inf_nan=False)
    """The longest a request waits for a slot before a 503 ``overloaded``."""
    route_balance: float = Field(0.25, ge=0, le=10, allow_inf_nan=False)
    """Several Tritons: a conversation's server takes at most (1 + this) times the average
    load before its requests spill to the next server on the ring."""
    route_prefix_chars: int = Field(1024, ge=0, le=1_000_000)
    """Several Tritons: a prompt at least this long (in characters, as rendered) is routed by
    its first this many characters, so requests that share a long prefix meet its cache.
    0: only conversations (``X-Session-ID``, ``previous_response_id``, ``prompt_cache_key``)
    are routed."""

    @property
    def edge_body_mb(self) -> float:
        """The largest request body the gateway takes, and so nginx's cap (MiB): the request
        limit, or an upload limit (audio, files) plus 1 MiB for a multipart body's
        boundaries and fields when that is larger. A larger body gets nginx's 413 and never
        reaches a replica; a replica reads a refused body up to this size to its end before
        it answers, so that nginx, still sending it, sees no reset
        (``gateway/api/middleware.py``)."""
        return max(self.max_request_mb, self.max_audio_upload_mb + 1, self.max_file_mb + 1)

    @field_validator("admin_key")
    @classmethod
    def _strong_admin_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            problem = weak_key_problem(value.get_secret_value())
            if problem:
                raise ValueError(f"GATEWAY_ADMIN_KEY is refused: {problem}")
        return value

    @field_validator("models", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _no_unknown_variables(self) -> Settings:
        """A ``GATEWAY_*`` variable that names no setting is refused: pydantic-settings reads
        only the names it knows, so a misspelt one (``GATEWAY_MAX_REQEST_MB``) would leave
        its setting at the default without a word. (A misspelt line of the ``.env`` file
        or keyword is refused by ``extra="forbid"`` above.)"""
        known = {f"GATEWAY_{name.upper()}" for name in type(self).model_fields}
        unknown = sorted(
            name
            for name in os.environ
            if name.startswith("GATEWAY_") and name.split("__")[0] not in known
        )
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not a setting of the gateway")
        return self
