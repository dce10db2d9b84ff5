"""Images in chat (image_url parts, Responses input_image) on the fake backend: what reaches
the model, the chat template's parts, and every bound and refusal (serving/images/)."""

from __future__ import annotations

import asyncio
import io
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from gateway.backend import ImageInput, ModelInfo
from gateway.backend.fake import FakeBackend
from gateway.config import CHATML_TEMPLATE, Settings
from gateway.errors import InvalidRequestError
from gateway.serving.images import ImageLimits, ImageReader, sources
from gateway.serving.images.parts import takes_parts
from gateway.serving.protocol import ChatMessage, ParamNames
from tests.support.bodies import assert_openai_error, sse_json
from tests.support.images import VISION_TEMPLATE, data_url, picture
from tests.support.inprocess import make_settings

CHAT = "/v1/chat/completions"


def image_part(url: str, detail: str | None = None) -> dict[str, Any]:
    image_url: dict[str, Any] = {"url": url}
    if detail is not None:
        image_url["detail"] = detail
    return {"type": "image_url", "image_url": image_url}


def asking(*parts: dict[str, Any], model: str = "fake-vision", **fields: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": "What is it?"}, *parts]
    return {"model": model, "messages": [{"role": "user", "content": content}], **fields}


@pytest.fixture
def fake() -> FakeBackend:
    backend = FakeBackend()
    backend.model_list += [
        ModelInfo("fake-vision", "chat", True, VISION_TEMPLATE, 2048, image_input=ImageInput()),
        ModelInfo(
            "fake-jpeg-only",
            "chat",
            True,
            VISION_TEMPLATE,
            2048,
            image_input=ImageInput(max_images=1, formats=("jpeg",)),
        ),
        # Said to see images, but its template prints content as a string.
        ModelInfo(
            "fake-vision-plain", "chat", True, CHATML_TEMPLATE, 2048, image_input=ImageInput()
        ),
    ]
    return backend


@pytest.fixture
def settings() -> Settings:
    return make_settings(max_images=3, max_image_mb=0.05, max_image_megapixels=2.0)


async def test_an_image_reaches_a_vision_model_and_its_template_gets_parts(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    png = picture(64, 32)
    body = asking(image_part(data_url(png)))
    body["messages"][0]["content"].append({"type": "text", "text": "Briefly."})
    response = await http.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    [call] = fake.calls
    [image] = call.images
    assert (image.format, image.width, image.height, image.data) == ("png", 64, 32, png)
    # The parts in their order, the image where it was sent.
    assert call.prompt == (
        "<|im_start|>user\nWhat is it?<image>Briefly.<|im_end|>\n<|im_start|>assistant\n"
    )


async def test_a_vision_models_text_messages_are_parts_too(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [image_part(data_url(picture(8, 8)))]},
    ]
    response = await http.post(CHAT, json={"model": "fake-vision", "messages": messages})
    assert response.status_code == 200, response.text
    assert fake.calls[0].prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<image><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


async def test_images_stream_too(http: httpx.AsyncClient, fake: FakeBackend) -> None:
    body = asking(image_part(data_url(picture(5, 7, "JPEG"), "image/jpeg")), stream=True)
    response = await http.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    assert sse_json(response.text)[-1]["choices"][0]["finish_reason"] == "stop"
    [image] = fake.calls[0].images
    assert (image.format, image.width, image.height) == ("jpeg", 5, 7)


async def test_a_text_model_refuses_an_image_naming_the_part(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    error = assert_openai_error(
        await http.post(CHAT, json=asking(image_part(data_url(picture(4, 4))), model="fake-chat")),
        400,
        param="messages.[0].content.[1]",
        code="image_not_supported",
    )
    assert "does not see images" in error["message"]
    assert fake.calls == []


async def test_models_say_which_see_images(client: openai.AsyncOpenAI) -> None:
    listed = await client.models.list()
    models = {m.id: (m.model_extra or {}).get("capabilities") or {} for m in listed.data}
    assert (models["fake-vision"]["images"], models["fake-vision"]["max_images"]) == (True, None)
    assert (models["fake-jpeg-only"]["images"], models["fake-jpeg-only"]["max_images"]) == (True, 1)
    assert models["fake-chat"]["images"] is False


@pytest.mark.parametrize(
    ("detail", "size"),
    [("low", (512, 256)), ("high", (1024, 512)), ("auto", (1024, 512)), (None, (1024, 512))],
)
async def test_detail_low_shrinks_the_image_and_high_keeps_it(
    http: httpx.AsyncClient, fake: FakeBackend, detail: str | None, size: tuple[int, int]
) -> None:
    body = asking(image_part(data_url(picture(1024, 512, "JPEG")), detail))
    assert (await http.post(CHAT, json=body)).status_code == 200
    [image] = fake.calls[0].images
    assert ((image.width, image.height), image.format) == (size, "jpeg")
    with Image.open(io.BytesIO(image.data)) as sent:
        assert sent.size == size


async def test_an_unknown_detail_is_refused(http: httpx.AsyncClient) -> None:
    assert_openai_error(
        await http.post(CHAT, json=asking(image_part(data_url(picture(4, 4)), "ultra"))),
        400,
        param="messages.[0].content.[1].image_url.detail",
        code="invalid_value",
    )


async def test_a_jpeg_only_model_gets_a_png_as_jpeg_with_transparency_white(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    body = asking(image_part(data_url(picture(20, 10, mode="RGBA"))), model="fake-jpeg-only")
    assert (await http.post(CHAT, json=body)).status_code == 200
    [image] = fake.calls[0].images
    assert (image.format, image.width, image.height) == ("jpeg", 20, 10)
    with Image.open(io.BytesIO(image.data)) as sent:
        assert sent.format == "JPEG"
        assert all(channel > 240 for channel in sent.convert("RGB").getpixel((5, 5)))


async def test_the_models_own_image_bound_is_kept(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    one = image_part(data_url(picture(4, 4)))
    error = assert_openai_error(
        await http.post(CHAT, json=asking(one, one, model="fake-jpeg-only")),
        400,
        param="messages.[0].content.[2]",
        code="too_many_images",
    )
    assert "fake-jpeg-only" in error["message"]
    assert fake.calls == []


async def test_more_images_than_the_gateway_takes_are_refused(http: httpx.AsyncClient) -> None:
    one = image_part(data_url(picture(4, 4)))
    error = assert_openai_error(
        await http.post(CHAT, json=asking(one, one, one, one)),
        400,
        param="messages.[0].content.[4]",
        code="too_many_images",
    )
    assert "GATEWAY_MAX_IMAGES" in error["message"]


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("data:image/png;base64,not base64!", "invalid_image_url"),
        ("data:image/png,rawbytes", "invalid_image_url"),
        ("data:text/plain;base64,aGVsbG8=", "invalid_image_format"),
        ("data:image/png;base64,aGVsbG8gdGhlcmU=", "invalid_image_format"),
        (data_url(picture(4, 4, "BMP")), "invalid_image_format"),
        ("ftp://example.com/cat.png", "invalid_image_url"),
        ("https://example.com/cat.png", "invalid_image_url"),
    ],
)
async def test_bad_image_urls_are_refused_by_name(
    http: httpx.AsyncClient, fake: FakeBackend, url: str, code: str
) -> None:
    error = assert_openai_error(await http.post(CHAT, json=asking(image_part(url))), 400, code=code)
    assert error["param"].startswith("messages.[0].content.[1]")
    assert fake.calls == []


async def test_a_url_from_a_host_not_allowed_says_so(http: httpx.AsyncClient) -> None:
    error = assert_openai_error(
        await http.post(CHAT, json=asking(image_part("https://example.com/cat.png"))),
        400,
        param="messages.[0].content.[1].image_url.url",
    )
    assert "GATEWAY_IMAGE_URL_HOSTS" in error["message"]


async def test_too_large_a_file_or_picture_is_refused(http: httpx.AsyncClient) -> None:
    noisy = picture(200, 200, noise=True)
    assert len(noisy) > 0.05 * 1024 * 1024
    assert_openai_error(
        await http.post(CHAT, json=asking(image_part(data_url(noisy)))),
        400,
        param="messages.[0].content.[1].image_url.url",
        code="image_too_large",
    )
    error = assert_openai_error(
        await http.post(CHAT, json=asking(image_part(data_url(picture(2000, 1001))))),
        400,
        param="messages.[0].content.[1]",
        code="image_too_large",
    )
    assert "2000x1001" in error["message"]


@pytest.mark.parametrize(
    ("url", "detail", "library"),
    [
        # Pillow: "image file is truncated".
        (data_url(picture(700, 700, noise=True)[:4000]), "low", "image file is truncated"),
        # binascii: "Excess data after padding", "Incorrect padding".
        ("data:image/png;base64,iVBORw0KGgo=x", None, "excess data"),
        ("data:image/png;base64,iVBORw0KGgo", None, "padding"),
        # httpx: "Invalid port: 'x'".
        ("https://images.test:x/cat.png", None, "Invalid port"),
    ],
    # Named, not by their URLs: the noisy picture is random, and pytest-xdist's workers must
    # collect the same ids.
    ids=["truncated", "excess-data", "padding", "bad-port"],
)
async def test_a_refused_image_says_why_without_the_librarys_words(
    http: httpx.AsyncClient, url: str, detail: str | None, library: str
) -> None:
    body = asking(image_part(url, detail))
    error = assert_openai_error(await http.post(CHAT, json=body), 400)
    assert error["code"] in ("invalid_image_format", "invalid_image_url")
    assert library.lower() not in error["message"].lower()


async def test_an_animated_gif_is_refused(http: httpx.AsyncClient) -> None:
    frames = [Image.new("RGB", (4, 4), color) for color in ("red", "blue")]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:])
    assert_openai_error(
        await http.post(CHAT, json=asking(image_part(data_url(buffer.getvalue(), "image/gif")))),
        400,
        code="invalid_image_format",
    )


async def test_images_only_come_in_user_messages(http: httpx.AsyncClient) -> None:
    messages = [{"role": "system", "content": [image_part(data_url(picture(4, 4)))]}]
    assert_openai_error(
        await http.post(CHAT, json={"model": "fake-vision", "messages": messages}),
        400,
        param="messages.[0].content.[0]",
    )


async def test_a_session_refuses_images(http: httpx.AsyncClient, fake: FakeBackend) -> None:
    response = await http.post(
        CHAT, json=asking(image_part(data_url(picture(4, 4)))), headers={"X-Session-ID": "s1"}
    )
    error = assert_openai_error(response, 400, param="messages.[0].content.[1]")
    assert "X-Session-ID" in error["message"]
    assert fake.calls == []


async def test_responses_input_image_follows_the_same_path(
    client: openai.AsyncOpenAI, fake: FakeBackend
) -> None:
    png = picture(30, 20)
    content: Any = [
        {"type": "input_text", "text": "What is it?"},
        {"type": "input_image", "image_url": data_url(png), "detail": "auto"},
    ]
    response = await client.responses.create(
        model="fake-vision", input=[{"role": "user", "content": content}]
    )
    assert response.status == "completed"
    [image] = fake.calls[0].images
    assert (image.data, image.width, image.height) == (png, 30, 20)
    assert "What is it?<image>" in fake.calls[0].prompt


@pytest.mark.parametrize(
    ("part", "model", "param"),
    [
        (
            {"type": "input_image", "file_id": "file-1", "detail": "auto"},
            "fake-vision",
            "input[0].content[1].file_id",
        ),
        (
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
            "fake-chat",
            "input[0].content[1]",
        ),
        (
            {"type": "input_image", "image_url": "https://example.com/a.png"},
            "fake-vision",
            "input[0].content[1].image_url",
        ),
        (
            {"type": "input_image", "image_url": data_url(picture(4, 4)), "detail": "max"},
            "fake-vision",
            "input[0].content[1].detail",
        ),
    ],
)
async def test_responses_input_image_refusals_name_the_part(
    http: httpx.AsyncClient, fake: FakeBackend, part: dict[str, Any], model: str, param: str
) -> None:
    content = [{"type": "input_text", "text": "What is it?"}, part]
    body = {"model": model, "input": [{"role": "user", "content": content}]}
    assert_openai_error(await http.post("/v1/responses", json=body), 400, param=param)
    assert fake.calls == []


def anthropic_image(data: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


@pytest.mark.parametrize(
    ("model", "data", "named"),
    [
        ("fake-chat", "iVBORw0KGgo=", "messages[2].content[1]: The model 'fake-chat' does not see"),
        ("fake-vision", "!!not base64", "messages[2].content[1].source: "),
        ("fake-jpeg-only", "iVBORw0KGgo=", "messages[2].content[2]: The request has 2 images"),
    ],
)
async def test_messages_image_refusals_name_the_block_sent(
    http: httpx.AsyncClient, fake: FakeBackend, model: str, data: str, named: str
) -> None:
    """An Anthropic request's image is named by its own block (the chat request it is served
    as has a system message first and one part per block)."""
    ok = data_url(picture(8, 8)).split(",", 1)[1]
    images = [anthropic_image(data)] + ([anthropic_image(ok)] if model == "fake-jpeg-only" else [])
    if model == "fake-jpeg-only":
        images.reverse()
    turns = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi"},
        {"role": "user", "content": [{"type": "text", "text": "What is it?"}, *images]},
    ]
    body = {"model": model, "max_tokens": 8, "system": "Be brief.", "messages": turns}
    refused = await http.post("/v1/messages", json=body)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["message"].startswith(named), refused.text
    assert fake.calls == []


# -- fetching from allowed hosts (an httpx mock transport stands for the host) -------------


async def public(host: str, port: int) -> list[str]:
    """DNS for the tests' hosts: ``inside.test`` points at the gateway's own machine, every
    other name at a public address."""
    return ["127.0.0.1"] if host == "inside.test" else ["93.184.215.14"]


def reader(handler: Any, **limits: Any) -> ImageReader:
    hosts = ("images.test", "127.0.0.1:8123", "anyport.test:*", "inside.test")
    return ImageReader(
        ImageLimits(hosts=hosts, **limits),
        transport=httpx.MockTransport(handler),
        resolver=public,
    )


async def read(images: ImageReader, url: str) -> Any:
    message = ChatMessage(role="user", content=[image_part(url)])  # type: ignore[list-item]
    model = ModelInfo("vision", "chat", True, image_input=ImageInput())
    return await images.read([message], model, ParamNames())


async def test_an_allowed_host_is_fetched() -> None:
    png = picture(6, 3)
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=png, headers={"content-type": "image/png"})

    [image] = await read(reader(handler), "https://images.test/cat.png")
    assert (image.data, image.width) == (png, 6)
    # Sent to the address that was checked, for the name (Host, and TLS's server name).
    assert str(seen[0].url) == "https://93.184.215.14/cat.png"
    assert seen[0].headers["host"] == "images.test"
    assert seen[0].extensions["sni_hostname"] == "images.test"
    [image] = await read(reader(handler), "http://127.0.0.1:8123/cat.png")
    assert image.height == 3
    [image] = await read(reader(handler), "http://anyport.test:8080/cat.png")  # name:*
    assert seen[-1].headers["accept-encoding"] == "identity"


@pytest.mark.parametrize(
    ("answer", "url", "words"),
    [
        (httpx.Response(302, headers={"location": "https://evil.test/x.png"}), None, "redirect"),
        (httpx.Response(404), None, "404"),
        (
            httpx.Response(200, content=b"<html>", headers={"content-type": "text/html"}),
            None,
            "text/html",
        ),
        (
            httpx.Response(200, content=b"x" * 2000, headers={"content-type": "image/png"}),
            None,
            "larger than",
        ),
        (None, "https://other.test/cat.png", "does not fetch images from 'other.test'"),
        (None, "http://127.0.0.1:9999/cat.png", "does not fetch images from '127.0.0.1'"),
        # A bare name allows its scheme's default port only (no scanning the host's ports).
        (None, "https://images.test:6379/cat.png", "does not fetch images from 'images.test'"),
        # An allowed name that points inside the network (DNS of an attacker, rebinding).
        (None, "https://inside.test/cat.png", "resolves to an address inside the network"),
        (
            # A few KB that would inflate to gigabytes: refused, never inflated.
            httpx.Response(
                200,
                stream=httpx.ByteStream(b"\x1f\x8b" + b"\0" * 100),
                headers={"content-type": "image/png", "content-encoding": "gzip"},
            ),
            None,
            "Content-Encoding 'gzip'",
        ),
    ],
)
async def test_what_an_allowed_host_may_not_do(
    answer: httpx.Response | None, url: str | None, words: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert answer is not None, "a host not allowed was asked"
        return answer

    with pytest.raises(InvalidRequestError) as raised:
        await read(reader(handler, max_bytes=1000), url or "https://images.test/cat.png")
    assert words in str(raised.value)
    assert raised.value.param == "messages.[0].content.[0].image_url.url"


async def test_the_fetch_connects_to_the_address_that_was_checked() -> None:
    """DNS rebinding: the name answers a public address to the check, then an internal one
    (a TTL of 0). The gateway asks once and connects to what it checked."""
    answers = [["93.184.215.14"], ["169.254.169.254"]]
    asked: list[str] = []

    async def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return answers[min(len(asked), 2) - 1]

    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=picture(2, 2), headers={"content-type": "image/png"})

    images = ImageReader(
        ImageLimits(hosts=("images.test:*",)),
        transport=httpx.MockTransport(handler),
        resolver=rebinding,
    )
    await read(images, "https://images.test:8443/cat.png")
    assert asked == ["images.test"]
    [request] = seen
    assert (request.url.host, request.url.port) == ("93.184.215.14", 8443)
    assert request.headers["host"] == "images.test:8443"
    assert request.extensions["sni_hostname"] == "images.test"


async def test_the_next_checked_address_is_tried_when_one_does_not_connect() -> None:
    async def two(host: str, port: int) -> list[str]:
        return ["2606:2800:220:1:248:1893:25c8:1946", "93.184.215.14"]

    tried: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        tried.append(request.url.host)
        if ":" in request.url.host:
            raise httpx.ConnectError("no IPv6 route", request=request)
        return httpx.Response(200, content=picture(2, 2), headers={"content-type": "image/png"})

    images = ImageReader(
        ImageLimits(hosts=("images.test",)), transport=httpx.MockTransport(handler), resolver=two
    )
    await read(images, "https://images.test/cat.png")
    assert tried == ["2606:2800:220:1:248:1893:25c8:1946", "93.184.215.14"]

    # None connects: the client reads why, in the gateway's words (not httpx's).
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    unreachable = ImageReader(
        ImageLimits(hosts=("images.test",)), transport=httpx.MockTransport(down), resolver=two
    )
    with pytest.raises(InvalidRequestError) as refused:
        await read(unreachable, "https://images.test/cat.png")
    assert (
        str(refused.value) == "The image URL could not be fetched: its host could not be reached."
    )


#: Addresses inside the network, and IPv6 forms that wrap them: what a translator or tunnel
#: on the way (NAT64, 6to4, Teredo, an IPv4-mapped socket) may deliver to the IPv4 inside.
INSIDE = [
    "127.0.0.1",
    "10.0.0.1",
    "169.254.169.254",
    "100.64.0.1",  # carrier-grade NAT
    "224.0.0.251",  # multicast
    "::1",
    "fd00::1",
    "fe80::1",
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:0:10.0.0.1",  # IPv4-translated (SIIT)
    "::127.0.0.1",  # IPv4-compatible
    "::a9fe:a9fe",  # IPv4-compatible 169.254.169.254
    "64:ff9b::127.0.0.1",  # NAT64, well-known prefix
    "64:ff9b::10.1.2.3",
    "64:ff9b::169.254.169.254",
    "64:ff9b:1::a9fe:a9fe",  # NAT64, local-use prefix
    "64:ff9b:1:ffff::a00:1",
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:a00:1::",  # 6to4 of 10.0.0.1
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1
    "2001:0:a00:1::1",  # Teredo, server 10.0.0.1
    "2001:0:4136:e378:8000:63bf:5601:5601",  # Teredo, client 169.254.169.254
]


@pytest.mark.parametrize("address", INSIDE)
async def test_an_internal_address_in_ipv6_clothes_is_refused(address: str) -> None:
    async def wrapped(host: str, port: int) -> list[str]:
        return ["93.184.215.14", address]  # one bad address refuses the name

    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"fetched from {request.url.host}")

    images = ImageReader(
        ImageLimits(hosts=("images.test",)),
        transport=httpx.MockTransport(handler),
        resolver=wrapped,
    )
    with pytest.raises(InvalidRequestError, match="resolves to an address inside the network"):
        await read(images, "https://images.test/cat.png")


@pytest.mark.parametrize(
    "address",
    [
        "2606:2800:220:1:248:1893:25c8:1946",  # native IPv6
        "64:ff9b::93.184.215.14",  # NAT64 of a public address
        "2002:5db8:d70e::1",  # 6to4 of a public address
    ],
)
async def test_public_addresses_in_any_form_are_fetched(address: str) -> None:
    async def public_(host: str, port: int) -> list[str]:
        return [address]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=picture(2, 2), headers={"content-type": "image/png"})

    images = ImageReader(
        ImageLimits(hosts=("images.test",)),
        transport=httpx.MockTransport(handler),
        resolver=public_,
    )
    [image] = await read(images, "https://images.test/cat.png")
    assert image.width == 2


async def test_a_real_connection_goes_to_the_checked_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over a real socket (httpx's own transport): the name resolves to a loopback server,
    which the check is told to take as public for this test; the server is reached, and
    sees the name in Host. The second answer, which the check never saw, is never used."""
    hosts_seen: list[str] = []
    png = picture(3, 3)

    class Images(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hosts_seen.append(self.headers["Host"])
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(png)))
            self.end_headers()
            self.wfile.write(png)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    answers = iter([["127.0.0.1"], ["192.0.2.1"]])

    async def rebinding(host: str, port: int) -> list[str]:
        return next(answers)

    monkeypatch.setattr(sources, "outside", lambda a: str(a) == "127.0.0.1")
    try:
        images = ImageReader(ImageLimits(hosts=("images.test:*",)), resolver=rebinding)
        [image] = await read(images, f"http://images.test:{port}/cat.png")
    finally:
        server.shutdown()
        server.server_close()
    assert image.data == png
    assert hosts_seen == [f"images.test:{port}"]


async def test_a_slow_host_is_cut_off() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200)

    with pytest.raises(InvalidRequestError, match=r"did not answer within 0\.2 s"):
        await read(reader(handler, timeout_s=0.2), "https://images.test/cat.png")


# -- templates that can place images ------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "takes"),
    [
        (VISION_TEMPLATE, True),
        (
            "{% for m in messages %}{% for c in m['content'] | selectattr('type', 'equalto', "
            "'image') %}<image>{% endfor %}{% endfor %}",
            True,
        ),
        (CHATML_TEMPLATE, False),
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", False),
        ("{% for m in messages %", False),
    ],
)
def test_a_template_takes_parts_when_it_loops_over_content(template: str, takes: bool) -> None:
    assert takes_parts(template) is takes


async def test_a_vision_model_with_a_text_template_keeps_text_and_refuses_images(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    body = {"model": "fake-vision-plain", "messages": [{"role": "user", "content": "Hi"}]}
    assert (await http.post(CHAT, json=body)).status_code == 200
    assert fake.calls[0].prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    error = assert_openai_error(
        await http.post(
            CHAT, json=asking(image_part(data_url(picture(4, 4))), model="fake-vision-plain")
        ),
        400,
        param="messages.[0].content.[1]",
        code="image_not_supported",
    )
    assert "chat template" in error["message"]
    assert len(fake.calls) == 1


async def test_n_choices_send_every_image_each_so_n_times_images_is_bounded(
    http: httpx.AsyncClient, fake: FakeBackend
) -> None:
    """This app's GATEWAY_MAX_IMAGES is 3."""
    body = asking(image_part(data_url(picture(4, 4))), n=4)
    assert_openai_error(await http.post(CHAT, json=body), 400, param="n", code="too_many_images")
    body["n"] = 3
    answer = await http.post(CHAT, json=body)
    assert answer.status_code == 200, answer.text
    assert len(fake.calls) == 3 and all(len(call.images) == 1 for call in fake.calls)
