"""Images in chat: ``image_url`` content parts read, checked and made ready for the model.

A part is ``{"type": "image_url", "image_url": {"url": ..., "detail": ...}}`` (Responses'
``input_image`` parts are turned into these, see ``responses/conversion.py``):

- ``url``: a ``data:image/<jpeg|png|gif|webp>;base64,...`` URL, or an ``http(s)`` URL on a
  host the operator allows (``GATEWAY_IMAGE_URL_HOSTS``, empty by default: none). The
  gateway fetches it itself (the model never fetches: a backend that does, TensorRT-LLM's
  preprocessing, would do so with no bound), within ``GATEWAY_IMAGE_FETCH_TIMEOUT_S`` and
  ``GATEWAY_MAX_IMAGE_MB``, and takes it only with an image ``Content-Type``. Redirects are
  not followed, to any host: following one to another host would let an allowed host send
  the gateway anywhere, and a redirect on the same host is a URL the client can send
  itself.
- The bytes must be a JPEG, PNG, WebP or still GIF (OpenAI's formats) of at most
  ``GATEWAY_MAX_IMAGE_MEGAPIXELS``; at most ``GATEWAY_MAX_IMAGES`` per request.
- ``detail``: ``auto`` and ``high`` send the image as it came (the model's own processor
  sizes it), ``low`` sends it shrunk to fit 512 x 512 pixels (OpenAI's low-resolution
  image); any other value is a 400.

Only a model whose ``ModelInfo.images`` is set sees images; for any other an image part is
a 400 naming it. A model that decodes fewer encodings (TensorRT-LLM: JPEG only) gets the
others converted (transparency flattened onto white). Decoding and converting run in a
thread. A session (``X-Session-ID``) stores text only, so image parts are refused there.

The chat template of a model that sees images gets every message's content as a list of
parts in Hugging Face's shape (``{"type": "text", "text": ...}``, ``{"type": "image"}``),
as multimodal templates iterate it; other models keep plain text content.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx

from gateway.backend import ChatImage, ModelInfo
from gateway.serving.images.parts import (
    ImageLimits,
    ImagePart,
    image_parts,
    refused,
    template_messages,
)
from gateway.serving.images.pictures import checked
from gateway.serving.images.sources import ImageSources, Resolver, resolve
from gateway.serving.protocol import ChatMessage, ParamNames

__all__ = ["ImageLimits", "ImagePart", "ImageReader", "image_parts", "template_messages"]


#: Pictures the process reads at once (each a thread of the default pool, which audio
#: decoding shares): the memory of GATEWAY_MAX_IMAGE_MEGAPIXELS x 4 bytes, this many times.
DECODES = 2


class ImageReader:
    """Reads the images of a request within :class:`ImageLimits`. ``transport``: an httpx
    transport for the URL fetches (tests give a mock one)."""

    def __init__(
        self,
        limits: ImageLimits,
        transport: httpx.AsyncBaseTransport | None = None,
        resolver: Resolver = resolve,
    ) -> None:
        self.limits = limits
        self.sources = ImageSources(limits, transport, resolver)
        self._decoding = asyncio.Semaphore(DECODES)

    async def read(
        self,
        messages: Sequence[ChatMessage],
        model: ModelInfo,
        names: ParamNames,
        session: bool = False,
        n: int = 1,
    ) -> tuple[ChatImage, ...]:
        """The images of ``messages`` for ``model``, in order, or a 400 naming the part.
        Each of ``n`` choices sends them all: ``n`` x images is bounded as images are."""
        parts = image_parts(messages, names)
        if not parts:
            return ()
        first = parts[0]
        if model.image_input is None:
            raise refused(
                f"The model '{model.name}' does not see images (its capabilities in "
                "/v1/models say which models do); send this message as text only.",
                first.param,
                "image_not_supported",
            )
        if session:
            raise refused(
                "A session (X-Session-ID) stores text only, so it cannot keep this image for "
                "later turns; send the conversation without X-Session-ID.",
                first.param,
                "image_not_supported",
            )
        bound = self.limits.max_images
        if model.image_input.max_images is not None and model.image_input.max_images < bound:
            bound = model.image_input.max_images
        if len(parts) > bound:
            whose = (
                "the gateway takes (GATEWAY_MAX_IMAGES)"
                if bound == self.limits.max_images
                else f"the model '{model.name}' takes"
            )
            raise refused(
                f"The request has {len(parts)} images; at most {bound} per request {whose}.",
                parts[bound].param,
                "too_many_images",
            )
        if n > 1 and n * len(parts) > self.limits.max_images:
            raise refused(
                f"Each of the n={n} choices sends the request's {len(parts)} image(s) to the "
                f"model: {n * len(parts)} in all, and at most {self.limits.max_images} go "
                "with one request (GATEWAY_MAX_IMAGES). Lower n.",
                "n",
                "too_many_images",
            )
        target = model.image_input.formats
        fetches = [asyncio.ensure_future(self.sources.file(part)) for part in parts]
        try:
            files = await asyncio.gather(*fetches)
        except BaseException:
            for fetch in fetches:  # the first refusal ends the others' fetches
                fetch.cancel()
            await asyncio.gather(*fetches, return_exceptions=True)
            raise
        # One at a time: a picture shrunk or converted is decoded whole (up to
        # GATEWAY_MAX_IMAGE_MEGAPIXELS x 4 bytes), and one request holds one such at once;
        # the process decodes at most DECODES at once, whatever the requests.
        checks = []
        for data, part in zip(files, parts, strict=True):
            async with self._decoding:
                checks.append(await asyncio.to_thread(checked, data, part, target, self.limits))
        return tuple(checks)
