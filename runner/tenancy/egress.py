"""`fetch` from a workflow, done by the host under the scope's egress policy
(docs/ARCHITECTURE.md, Egress).

The sandbox's `fetch` is a journaled tool call to `FETCH_ADDRESS`; this module is that tool.
Nothing is allowed unless the scope's policy names it (a host, `*.domain`, or a URL prefix).
The host name is resolved here and every address checked: private, loopback, link-local,
multicast and reserved addresses (the cloud metadata address among them) are refused unless
the policy allows private addresses. The request then goes to the checked address itself (the
`Host` header and TLS server name keep the name), so a second DNS answer cannot send it
elsewhere; each redirect is checked the same way. Size caps bound every call, and one
deadline (`timeout_s`) the whole of it: resolving, connecting, every redirect, the body.

What is judged is what is sent: a path holding a dot segment in any spelling (`%2e%2e`,
`..%2f`, `..;`, a backslash, encoded twice) is refused, since a server that normalises paths
would serve another path than the one the policy read; a URL prefix must match the path both
as it goes on the wire and decoded.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import ipaddress
import socket
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import certifi

from qjsflow.runner.errors import FatalToolError

# httpx is imported where a fetch needs it, not with this module: every CLI command loads the
# runner, and httpx (with the command line it brings) would add a fifth to `qjsflow status`.
if TYPE_CHECKING:
    import httpx

__all__ = ["FETCH_ADDRESS", "EgressPolicy", "fetch"]

FETCH_ADDRESS = "qjsflow.fetch"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Set by the host for the checked address; a workflow may not set them.
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer"}
)
_MAX_HEADERS = 100


@dataclass(frozen=True)
class EgressPolicy:
    """Where a scope's workflows may `fetch`. `allow` entries: `api.example.com` (that host,
    http or https), `*.example.com` (its subdomains), or a URL prefix
    (`https://api.example.com/v1/`). The default allows nothing."""

    allow: tuple[str, ...] = ()
    allow_private: bool = False  # loopback, private and link-local addresses (tests, a LAN)
    timeout_s: float = 10.0
    max_request_bytes: int = 1024 * 1024
    max_response_bytes: int = 512 * 1024  # a response is journaled: under the value limit
    max_redirects: int = 5
    # Allow lists that must each allow a URL too: the snapshot's manifest and the scope's
    # capability policy (runner/tenancy/capabilities.py), checked at every redirect like `allow`.
    within: tuple[tuple[str, ...], ...] = ()

    def allows(self, url: httpx.URL) -> bool:
        return self._listed(self.allow, url) and all(
            self._listed(entries, url) for entries in self.within
        )

    @staticmethod
    def _listed(entries: tuple[str, ...], url: httpx.URL) -> bool:
        import httpx  # noqa: PLC0415  (imported lazily: see the note above)

        host = (url.host or "").lower()
        for allowed in entries:
            entry = allowed.lower()
            if "://" in entry:
                # Compared parsed, never as text: "https://api.example.com" must not let
                # "https://api.example.com.evil.test/" through.
                prefix = httpx.URL(entry)
                same_origin = (prefix.scheme, prefix.host, prefix.port) == (
                    url.scheme,
                    host,
                    url.port,
                )
                wire = prefix.raw_path.split(b"?", 1)[0] or b"/"
                if (
                    same_origin
                    and url.path.startswith(prefix.path or "/")
                    and url.raw_path.startswith(wire)
                ):
                    return True
            elif entry.startswith("*."):
                if host.endswith(entry[1:]):
                    return True
            elif host == entry and url.scheme in ("http", "https"):
                return True
        return False


async def fetch(
    args: Mapping[str, Any],
    policy: EgressPolicy,
    scope: str,
    secrets: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Carry out one `fetch` (args from the sandbox: url, method, headers, body). A header
    value may name a secret as the sandbox prints it (`Bearer [secret API_KEY]`, from a
    template string): the value is put in its place here."""
    method = str(args.get("method", "GET")).upper()
    if method not in _METHODS:
        raise FatalToolError(f"fetch: the method {method[:20]!r} is not allowed")
    headers = _headers(args.get("headers") or [], secrets or {})
    body = args.get("body")
    content = None if body is None else str(body).encode("utf-8")
    if content is not None and len(content) > policy.max_request_bytes:
        raise FatalToolError(
            f"fetch: the request body is larger than {policy.max_request_bytes} bytes"
        )
    url = _url(str(args.get("url", "")))
    try:
        async with asyncio.timeout(policy.timeout_s):
            return await _follow(_Request(method, url, headers, content), policy, scope)
    except TimeoutError:
        raise FatalToolError(
            f"fetch {url.host!r}: no whole answer within {policy.timeout_s:g} s "
            "(EgressPolicy.timeout_s bounds the call: connect, redirects and body)"
        ) from None


async def _follow(first: _Request, policy: EgressPolicy, scope: str) -> dict[str, Any]:
    """The request and the redirects it leads to, each hop checked as the first."""
    import httpx  # noqa: PLC0415  (imported lazily: see the note above)

    method, url, headers, content = first.method, first.url, first.headers, first.content
    async with httpx.AsyncClient(
        timeout=None, follow_redirects=False, trust_env=False, verify=_tls()
    ) as client:
        for hop in range(policy.max_redirects + 1):
            address = await _checked_address(url, policy, scope)
            response = await _send(client, _Request(method, url, headers, content), address, policy)
            location = response["headers_map"].get("location")
            status = response["status"]
            if status in (301, 302, 303, 307, 308) and location:
                url = _plain_path(url.join(location))
                if status == 303 or (status in (301, 302) and method == "POST"):
                    method, content = "GET", None
                continue
            response["redirected"] = hop > 0
            response["url"] = str(url)
            del response["headers_map"]
            return response
    raise FatalToolError(f"fetch: more than {policy.max_redirects} redirects")


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every fetch: making one loads the CA bundle (~30 ms a fetch)."""
    return ssl.create_default_context(cafile=certifi.where())


def _url(text: str) -> httpx.URL:
    import httpx  # noqa: PLC0415  (imported lazily: see the note above)

    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as error:
        raise FatalToolError(f"fetch: invalid URL ({error})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise FatalToolError(f"fetch: only http and https URLs can be fetched, not {text[:80]!r}")
    return _plain_path(url)


def _plain_path(url: httpx.URL) -> httpx.URL:
    """`url` if its path, in every decoding a server might apply, has no dot segment."""
    path = url.raw_path.split(b"?", 1)[0].decode("ascii", "replace")
    for _ in range(4):  # encoded up to three times over; a fourth pass finds it stable
        if "\\" in path or any(
            segment.split(";", 1)[0] in (".", "..") for segment in path.split("/")
        ):
            raise FatalToolError(
                f"fetch: the path of {str(url)[:120]!r} holds a dot segment or backslash "
                "(plain or percent-encoded): refused, since a server may resolve it to a path "
                "the egress policy did not judge"
            )
        decoded = urllib.parse.unquote(path)
        if decoded == path:
            break
        path = decoded
    return url


def _headers(raw: Any, secrets: Mapping[str, str]) -> list[tuple[str, str]]:
    if not isinstance(raw, list) or len(raw) > _MAX_HEADERS:
        raise FatalToolError(f"fetch: headers must be at most {_MAX_HEADERS} name/value pairs")
    headers = []
    for pair in raw:
        if not isinstance(pair, list) or len(pair) != 2:
            raise FatalToolError("fetch: each header is a name and a value")
        name, value = str(pair[0]), str(pair[1])
        for secret, text in secrets.items():
            value = value.replace(f"[secret {secret}]", text)
        if name.lower() in _RESERVED_HEADERS:
            raise FatalToolError(f"fetch: the header {name!r} is set by the host")
        if any(ord(c) < 32 for c in name + value):
            raise FatalToolError(f"fetch: the header {name[:40]!r} holds control characters")
        headers.append((name, value))
    return headers


async def _checked_address(url: httpx.URL, policy: EgressPolicy, scope: str) -> str:
    host = url.host
    if not policy.allows(url):
        raise FatalToolError(
            f"fetch to {host!r} is not allowed for scope {scope!r}: add it to the scope's "
            "egress allowlist (EgressPolicy.allow)"
        )
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise FatalToolError(f"fetch: cannot resolve {host!r} ({error.strerror})") from None
    literal = _ip_literal(host)
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(sockaddr[0])
        # An address the allowlist names itself is the operator's choice; a name that
        # resolves to a private one could be anyone's DNS answer (allow_private allows those).
        if policy.allow_private or address.is_global or address == literal:
            return str(address)
    raise FatalToolError(
        f"fetch to {host!r} is refused: it resolves to a private, loopback, link-local or "
        "reserved address (list the address itself in EgressPolicy.allow, or set "
        "allow_private for names that resolve to one)"
    )


def _ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


@dataclass(frozen=True)
class _Request:
    method: str
    url: httpx.URL
    headers: list[tuple[str, str]]
    content: bytes | None


async def _send(
    client: httpx.AsyncClient, wanted: _Request, address: str, policy: EgressPolicy
) -> dict[str, Any]:
    """One request to the checked `address`, keeping the name for Host and TLS."""
    import httpx  # noqa: PLC0415  (imported lazily: see the note above)

    url = wanted.url
    request = client.build_request(
        wanted.method, url.copy_with(host=address),
        headers=[*wanted.headers, ("host", url.netloc.decode("ascii"))],
        content=wanted.content, extensions={"sni_hostname": url.host},
    )  # fmt: skip
    try:
        response = await client.send(request, stream=True)
    except httpx.HTTPError as error:
        raise FatalToolError(f"fetch {url.host!r} failed: {type(error).__name__}") from None
    try:
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > policy.max_response_bytes:
                raise FatalToolError(
                    f"fetch: the response from {url.host!r} is larger than "
                    f"{policy.max_response_bytes} bytes"
                )
    finally:
        await response.aclose()
    pairs = [[name, value] for name, value in response.headers.multi_items()]
    try:
        text, encoding = bytes(body).decode("utf-8"), "text"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(bytes(body)).decode("ascii"), "base64"
    return {
        "status": response.status_code,
        "statusText": response.reason_phrase,
        "headers": pairs,
        "headers_map": {name.lower(): value for name, value in pairs},
        "body": text,
        "bodyEncoding": encoding,
    }
