"""Where a request comes from: the host names the console answers, and the origin a
state-changing request must prove.

A browser attaches cookies to requests that other sites' pages make, and a DNS name an
attacker controls can be pointed at loopback (DNS rebinding); so the console answers only the
host names it was configured for, and every POST that a browser could have sent proves it
came from the console's own pages: its `Origin` (or, without one, its `Referer`) names the
host it was sent to, and `Sec-Fetch-Site`, when a browser sends it, says same-origin. A
request with none of the three came from no browser (curl, the Python API's clients).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.exceptions import HTTPException
from starlette.requests import Request

from qjsflow.bridge import InvalidInput

__all__ = ["LOOPBACK_NAMES", "host_names", "prove_same_origin", "served_host"]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")
_MAX_NAME_CHARS = 253


def host_names(listen_host: str, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The names a console listening on `listen_host` answers: the loopback names, the
    address it listens on (unless it listens on every address) and the names given."""
    names = list(LOOPBACK_NAMES)
    if listen_host not in _WILDCARD_ADDRESSES:
        names.append(listen_host)
    for name in extra:
        names.append(_checked_name(name))
    return tuple(dict.fromkeys(name.lower() for name in names))


def _checked_name(name: str) -> str:
    """A host name or address as `--allow-host` takes it: no port, no scheme, no wildcard."""
    plain = name.strip().lower()
    try:
        ipaddress.ip_address(plain.strip("[]"))
        return plain.strip("[]")
    except ValueError:
        pass
    labels = plain.split(".")
    if not plain or len(plain) > _MAX_NAME_CHARS or not all(map(_is_label, labels)):
        raise InvalidInput(f"--allow-host {name[:80]!r} is not a host name (letters, digits, "
                           "hyphens and dots, or an IP address; no port, no wildcard)")  # fmt: skip
    return plain


def _is_label(label: str) -> bool:
    return 0 < len(label) <= 63 and all(c.isascii() and (c.isalnum() or c == "-") for c in label)


def served_host(request: Request, allowed: tuple[str, ...]) -> str | None:
    """The request's `Host` if it names one of `allowed` (any port), else None."""
    host = request.headers.get("host", "")
    name = urlsplit(f"//{host}").hostname if host else None
    if name is None:
        return None
    return host if name.lower() in allowed else None


def prove_same_origin(request: Request) -> None:
    """Refuse (403) a request that a browser sent from a page of another origin."""
    expected = f"{request.url.scheme}://{request.headers.get('host', '')}".lower()
    origin = request.headers.get("origin")
    if origin is not None:
        if origin.lower() != expected:
            raise HTTPException(403, "the request's Origin is not this console")
        return
    referer = request.headers.get("referer")
    if referer is not None:
        parts = urlsplit(referer)
        if f"{parts.scheme}://{parts.netloc}".lower() != expected:
            raise HTTPException(403, "the request's Referer is not this console")
        return
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        raise HTTPException(403, "the request came from another site")
