"""`qjsflow worker --health-port`: `/healthz` (the process answers and its journal can be
read) and `/readyz` (its worker loop is serving), for orchestrators' probes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from qjsflow.runner.store import JournalStore

__all__ = ["serve_health"]


async def serve_health(
    host: str, port: int, store: JournalStore, ready: Callable[[], bool]
) -> asyncio.Server:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            parts = line.split()
            path = parts[1].decode("ascii", "replace") if len(parts) >= 2 else ""
            if path == "/healthz":
                healthy = await _journal_answers(store)
                status, body = (200, "ok") if healthy else (503, "the journal cannot be read")
            elif path == "/readyz":
                status, body = (200, "ready") if ready() else (503, "not serving yet")
            else:
                status, body = 404, "no such probe: /healthz or /readyz"
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            payload = body.encode()
            writer.write(
                f"HTTP/1.0 {status} {reason}\r\nContent-Type: text/plain\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return await asyncio.start_server(answer, host, port)


async def _journal_answers(store: JournalStore) -> bool:
    try:
        await asyncio.wait_for(store.next_due(), 5)
        return True
    except Exception:
        return False
