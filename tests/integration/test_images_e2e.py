"""Images in chat on the real stack, with the official SDK: data-URL and fetched images to
the vision stand-ins (vLLM's ``image`` input, TensorRT-LLM's ``image_url_input``), which
answer with what they decoded, and the refusals a user meets (a host not allowed, a
redirect, a file too large, a model that sees no images).

The shared stack allows image URLs from 127.0.0.1 (conftest); a loopback HTTP server here
serves the images; ``localhost`` names the same server under a host that is not allowed."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
import openai
import pytest

from tests.support.images import data_url, picture
from tests.support.stack import GatewayProcess

pytestmark = pytest.mark.integration

TRTLLM_VISION = ["ensemble_vision", "tensorrt_llm_bls_vision"]
VISION = ["vllm_vision", *TRTLLM_VISION]


def asking(*urls: str) -> list[Any]:
    parts: list[Any] = [{"type": "text", "text": "What do you see?"}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": parts}]


class Images(BaseHTTPRequestHandler):
    """``/cat.png`` (40x30), ``/big.png`` (over 10 MB), ``/page.html``, ``/moved`` (a
    redirect to ``/cat.png`` on ``localhost``); every path asked is kept in ``asked``."""

    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        Images.asked.append(self.path)
        port = self.server.server_address[1]
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{port}/cat.png")
            self.end_headers()
            return
        bodies = {
            "/cat.png": ("image/png", picture(40, 30)),
            "/big.png": ("image/png", b"\x89PNG" + b"\0" * (11 * 1024 * 1024)),
            "/page.html": ("text/html", b"<html>a cat</html>"),
        }
        if self.path not in bodies:
            self.send_error(404)
            return
        kind, body = bodies[self.path]
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        # The gateway may hang up: it refuses the large file by its length.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Images)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def sdk(stack: GatewayProcess) -> openai.OpenAI:
    with httpx.Client(base_url=stack.base_url, headers=stack.headers, timeout=120) as http:
        for name in VISION:
            answer = http.post(f"/admin/models/{name}/load")
            assert answer.status_code == 200, answer.text
    return stack.client()


def answer(sdk: openai.OpenAI, model: str, messages: list[Any], stream: bool) -> str:
    if stream:
        chunks = sdk.chat.completions.create(model=model, messages=messages, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reply = sdk.chat.completions.create(model=model, messages=messages)
    return reply.choices[0].message.content or ""


def test_models_say_which_see_images(sdk: openai.OpenAI) -> None:
    capabilities = {m.id: (m.model_extra or {}).get("capabilities") for m in sdk.models.list()}
    assert capabilities["vllm_vision"]["images"] is True
    for model in TRTLLM_VISION:
        assert capabilities[model]["images"] is True
        assert capabilities[model]["max_images"] == 1
    assert capabilities["mock_chat"]["images"] is False


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_gets_every_image_in_order(sdk: openai.OpenAI, stream: bool) -> None:
    messages = asking(data_url(picture(64, 32)), data_url(picture(16, 16, "JPEG"), "image/jpeg"))
    said = answer(sdk, "vllm_vision", messages, stream)
    assert said == "Saw 2 images: 64x32 PNG, 16x16 JPEG."


@pytest.mark.parametrize("model", TRTLLM_VISION)
@pytest.mark.parametrize("stream", [False, True])
def test_tensorrt_llm_gets_a_png_as_a_jpeg_data_url(
    sdk: openai.OpenAI, model: str, stream: bool
) -> None:
    """The ensemble's image goes through its steps (preprocessing's pixels, the encoder's
    table, the engine); the BLS reads it itself."""
    said = answer(sdk, model, asking(data_url(picture(64, 32))), stream)
    assert said == "Saw 1 image: 64x32 JPEG."


def test_the_multimodal_ensemble_answers_text_alone(sdk: openai.OpenAI) -> None:
    said = answer(sdk, "ensemble_vision", [{"role": "user", "content": "Hi"}], False)
    assert said == "The quick brown fox jumps over the lazy dog."


@pytest.mark.parametrize("model", TRTLLM_VISION)
def test_tensorrt_llm_takes_one_image_a_request(sdk: openai.OpenAI, model: str) -> None:
    url = data_url(picture(8, 8))
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model=model, messages=asking(url, url))
    assert refused.value.body["param"] == "messages.[0].content.[2]"  # type: ignore[index]
    assert refused.value.body["code"] == "too_many_images"  # type: ignore[index]


def test_detail_low_sends_a_smaller_picture(sdk: openai.OpenAI) -> None:
    part = {
        "type": "image_url",
        "image_url": {"url": data_url(picture(1024, 256)), "detail": "low"},
    }
    messages: Any = [{"role": "user", "content": [part]}]
    assert answer(sdk, "vllm_vision", messages, False) == "Saw 1 image: 512x128 PNG."


@pytest.mark.parametrize("stream", [False, True])
def test_an_image_from_an_allowed_host_is_fetched(
    sdk: openai.OpenAI, server: int, stream: bool
) -> None:
    said = answer(sdk, "vllm_vision", asking(f"http://127.0.0.1:{server}/cat.png"), stream)
    assert said == "Saw 1 image: 40x30 PNG."


@pytest.mark.parametrize(
    ("path", "host", "words", "code"),
    [
        ("/cat.png", "localhost", "does not fetch images from 'localhost'", "invalid_image_url"),
        ("/moved", "127.0.0.1", "follows no redirect", "invalid_image_url"),
        ("/big.png", "127.0.0.1", "larger than 10 MB", "image_too_large"),
        ("/page.html", "127.0.0.1", "text/html", "invalid_image_format"),
        ("/gone.png", "127.0.0.1", "answered 404", "invalid_image_url"),
    ],
)
def test_what_the_gateway_does_not_fetch(
    sdk: openai.OpenAI, server: int, path: str, host: str, words: str, code: str
) -> None:
    Images.asked.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model="vllm_vision", messages=asking(f"http://{host}:{server}{path}")
        )
    body: Any = refused.value.body
    assert (body["param"], body["code"]) == ("messages.[0].content.[1].image_url.url", code)
    assert words in body["message"]
    # A host not allowed is never asked; a redirect is not followed.
    assert Images.asked == ([] if host == "localhost" else [path])


@pytest.mark.parametrize("stream", [False, True])
def test_a_model_that_sees_no_images_refuses_them(sdk: openai.OpenAI, stream: bool) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model="mock_chat", messages=asking(data_url(picture(4, 4))), stream=stream
        )
    body: Any = refused.value.body
    assert (body["param"], body["code"]) == ("messages.[0].content.[1]", "image_not_supported")


@pytest.mark.parametrize("stream", [False, True])
def test_responses_input_image(sdk: openai.OpenAI, stream: bool) -> None:
    content: Any = [
        {"type": "input_text", "text": "What do you see?"},
        {"type": "input_image", "image_url": data_url(picture(20, 10)), "detail": "auto"},
    ]
    request: Any = {"model": "vllm_vision", "input": [{"role": "user", "content": content}]}
    if stream:
        events = list(sdk.responses.create(**request, stream=True))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    else:
        text = sdk.responses.create(**request).output_text
    assert text == "Saw 1 image: 20x10 PNG."


def test_responses_refuses_a_file_id_by_name(sdk: openai.OpenAI) -> None:
    content: Any = [{"type": "input_image", "file_id": "file-abc", "detail": "auto"}]
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model="vllm_vision", input=[{"role": "user", "content": content}])
    assert refused.value.body["param"] == "input[0].content[0].file_id"  # type: ignore[index]
