"""Loopback ports for the servers tests start (PostgreSQL, the console, metrics, dev)."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
from collections.abc import Iterator


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def http_server(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A threaded HTTP server on loopback answering with `handler`; its base URL."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
