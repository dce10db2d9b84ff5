"""Where an image's file comes from: a ``data:`` URL, or an ``http(s)`` URL on a host the
operator allows, fetched within the limits and without following redirects.

An allowed host is a name (its scheme's default port only), ``name:port`` (that port) or
``name:*`` (any port); an IP address is allowed only where it is listed. A name is resolved
once, and refused when any of its addresses points inside the network (loopback, private,
link-local, reserved, multicast), also where an IPv6 address only wraps such an IPv4 one
(IPv4-mapped or -compatible, NAT64, 6to4, Teredo): a listed public name cannot be made to
reach the gateway's neighbours. The fetch then connects to the very addresses that were
checked (the URL's name stays the ``Host`` header and, over TLS, the name sent and the one
the certificate must match), so a name that answers a public address to the check and an
internal one a moment later (DNS rebinding) is still fetched from the public one. The body
is taken as sent (``Accept-Encoding: identity``; a compressed one is refused), so the size
bound is the bytes held in memory.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import httpx

from gateway.serving.images.parts import ImageLimits, ImagePart, refused, too_large

#: The media types taken, and the encoding each names (Pillow's format, lowercase).
MEDIA_TYPES = {
    "image/jpeg": "jpeg",
    "image/jpg": "jpeg",
    "image/png": "png",
    "image/gif": "gif",
    "image/webp": "webp",
}
_CHUNK = 64 * 1024

#: Resolves a host name and port to its IP addresses.
Resolver = Callable[[str, int], Awaitable[list[str]]]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

#: NAT64's well-known prefix (RFC 6052): the IPv4 address is the last 32 bits.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
#: NAT64's local-use prefix (RFC 8215): its translator is inside the network, and where
#: it puts the IPv4 address depends on the prefix length chosen, so none is fetched from.
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
#: IPv4-translated addresses (SIIT, RFC 2765): ``::ffff:0:a.b.c.d``.
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
#: IPv4-compatible addresses (deprecated): ``::a.b.c.d``.
_COMPATIBLE = ipaddress.IPv6Network("::/96")


async def resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _default_port(url: httpx.URL) -> int:
    return 443 if url.scheme == "https" else 80


def _ip(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def wrapped(address: Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 ``address`` carries, which a translator or tunnel on the
    way may deliver to: IPv4-mapped, IPv4-translated, IPv4-compatible, NAT64 (well-known
    prefix), 6to4, and Teredo's server and client."""
    if isinstance(address, ipaddress.IPv4Address):
        return []
    low = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    found = [address.ipv4_mapped, address.sixtofour]
    if address in _TRANSLATED or address in _COMPATIBLE or address in _NAT64:
        found.append(low)
    if address.teredo is not None:
        found += address.teredo
    return [v4 for v4 in found if v4 is not None]


def outside(address: Address) -> bool:
    """Whether the gateway may fetch from ``address``: a global unicast address that wraps
    no address inside the network (see :func:`wrapped`)."""
    if isinstance(address, ipaddress.IPv6Address) and address in _NAT64_LOCAL:
        return False
    return all(a.is_global and not a.is_multicast for a in (address, *wrapped(address)))


class ImageSources:
    """Reads image files within :class:`ImageLimits`. ``transport``: an httpx transport for
    the URL fetches, and ``resolver`` the names' lookup (tests give their own)."""

    def __init__(
        self,
        limits: ImageLimits,
        transport: httpx.AsyncBaseTransport | None = None,
        resolver: Resolver = resolve,
    ) -> None:
        self.limits = limits
        self.transport = transport
        self.resolver = resolver

    async def file(self, part: ImagePart) -> bytes:
        """The part's file: its data URL decoded (in a thread), or its URL fetched."""
        url = part.url
        if url[:5].lower() == "data:":
            return await asyncio.to_thread(self._data_url, url, part.url_param)
        scheme = urlsplit(url).scheme.lower()
        if scheme in ("http", "https"):
            return await self._fetch(url, part.url_param)
        raise refused(
            "An image URL is a data: URL (data:image/png;base64,...) or an http(s) URL on a "
            "host the operator allows.",
            part.url_param,
            "invalid_image_url",
        )

    def _data_url(self, url: str, param: str) -> bytes:
        header, comma, payload = url.partition(",")
        fields = header[5:].split(";")
        media = fields[0].strip().lower()
        if not comma or "base64" not in (f.strip().lower() for f in fields[1:]):
            raise refused(
                "A data URL image is base64: data:image/png;base64,<data>.",
                param,
                "invalid_image_url",
            )
        if media not in MEDIA_TYPES:
            raise refused(
                f"The data URL's type is '{media or 'none'}'; images are taken as "
                "image/jpeg, image/png, image/gif or image/webp.",
                param,
                "invalid_image_format",
            )
        if len(payload) // 4 * 3 > self.limits.max_bytes + 3:
            raise too_large(self.limits, param)
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise refused(
                "The data URL's data is not valid base64.", param, "invalid_image_url"
            ) from exc

    def _allowed(self, url: httpx.URL) -> bool:
        """A bare name allows its scheme's default port only; ``name:port`` that port;
        ``name:*`` any."""
        host = url.host.lower()
        default = _default_port(url)
        port = url.port or default
        bare = port == default
        return any(
            (entry == host and bare) or entry in (f"{host}:{port}", f"{host}:*")
            for entry in self.limits.hosts
        )

    async def _addresses(self, url: httpx.URL, param: str) -> list[str]:
        """Where to connect for ``url``: its IP address, as listed (taken as it is), or
        the addresses its name resolves to, resolved once, each checked; a 400 when any of
        them is inside the network."""
        literal = _ip(url.host)
        if literal is not None:
            return [str(literal)]
        port = url.port or _default_port(url)
        try:
            answers = await self.resolver(url.raw_host.decode("ascii"), port)
            addresses = [ipaddress.ip_address(a) for a in answers]
        except (OSError, ValueError) as exc:
            raise refused(
                f"The image URL's host '{url.host}' does not resolve.", param, "invalid_image_url"
            ) from exc
        if not addresses or not all(outside(a) for a in addresses):
            raise refused(
                f"The image URL's host '{url.host}' resolves to an address inside the network; "
                "the gateway fetches from such an address only where GATEWAY_IMAGE_URL_HOSTS "
                "lists the address itself.",
                param,
                "invalid_image_url",
            )
        return list(dict.fromkeys(str(a) for a in addresses))

    async def _fetch(self, raw: str, param: str) -> bytes:
        try:
            url = httpx.URL(raw)
        except httpx.InvalidURL as exc:
            raise refused(
                "The image URL is not a valid http(s) URL.", param, "invalid_image_url"
            ) from exc
        if not url.host or not self._allowed(url):
            allowed = (
                "no host is allowed here, so send the image as a data: URL"
                if not self.limits.hosts
                else "allowed hosts: " + ", ".join(self.limits.hosts)
            )
            raise refused(
                f"The gateway does not fetch images from '{url.host}' "
                f"(GATEWAY_IMAGE_URL_HOSTS; {allowed}).",
                param,
                "invalid_image_url",
            )
        try:
            async with asyncio.timeout(self.limits.timeout_s):
                addresses = await self._addresses(url, param)
                for address in addresses[:-1]:
                    try:
                        return await self._download(url, address, param)
                    except httpx.ConnectError:
                        continue  # the next address, as a client tries a name's addresses
                return await self._download(url, addresses[-1], param)
        except TimeoutError as exc:
            raise refused(
                f"The image URL did not answer within {self.limits.timeout_s:g} s "
                "(GATEWAY_IMAGE_FETCH_TIMEOUT_S).",
                param,
                "invalid_image_url",
            ) from exc
        except httpx.HTTPError as exc:
            what = "could not be reached" if isinstance(exc, httpx.ConnectError) else "broke off"
            raise refused(
                f"The image URL could not be fetched: its host {what}.",
                param,
                "invalid_image_url",
            ) from exc

    async def _download(self, url: httpx.URL, address: str, param: str) -> bytes:
        """``url`` fetched from ``address`` (checked): the request goes to that address,
        and names the URL's host in ``Host`` and, over TLS, as the server name (SNI) that
        the certificate is verified against."""
        name = url.raw_host.decode("ascii")
        headers = {"Host": url.netloc.decode("ascii"), "Accept": "image/*"}
        headers["Accept-Encoding"] = "identity"
        async with (
            httpx.AsyncClient(
                transport=self.transport,
                follow_redirects=False,
                timeout=self.limits.timeout_s,
                trust_env=False,  # no proxy from the environment: the host is the one allowed
            ) as client,
            client.stream(
                "GET",
                url.copy_with(host=address),
                headers=headers,
                extensions={"sni_hostname": name},
            ) as response,
        ):
            if response.is_redirect:
                # Where it points is not repeated: it may name a host the client should not
                # learn of.
                raise refused(
                    f"The image URL answered {response.status_code}, a redirect; the gateway "
                    "follows no redirect, so send the image's own URL.",
                    param,
                    "invalid_image_url",
                )
            if response.status_code != 200:
                raise refused(
                    f"The image URL answered {response.status_code}.", param, "invalid_image_url"
                )
            media = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if media not in MEDIA_TYPES:
                raise refused(
                    f"The image URL's Content-Type is '{media or 'none'}'; images are taken "
                    "as image/jpeg, image/png, image/gif or image/webp.",
                    param,
                    "invalid_image_format",
                )
            coding = response.headers.get("content-encoding", "identity").strip().lower()
            if coding not in ("", "identity"):
                # Inflated, a few KB could be gigabytes: only the bytes as sent are bounded.
                raise refused(
                    f"The image URL answered with Content-Encoding '{coding}'; the gateway "
                    "asks for the file as it is and takes it only so.",
                    param,
                    "invalid_image_url",
                )
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.limits.max_bytes:
                raise too_large(self.limits, param)
            data = bytearray()
            async for chunk in response.aiter_bytes(_CHUNK):  # identity: nothing inflates
                data += chunk
                if len(data) > self.limits.max_bytes:
                    raise too_large(self.limits, param)
            return bytes(data)
