"""Wake-ups without polling (PostgreSQL): a transaction that makes a run claimable — a start,
an event, an admission, a resume, a cancel — runs `NOTIFY qjsflow_work` (`wake_workers`),
delivered as it commits; each worker LISTENs on a connection of its own and looks for work at
once. The worker's poll stays, as a backstop: a notification lost with a dropped connection
is made up by a look as the listener reconnects, and by the next poll.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable

from qjsflow.runner.store.dialect import WAKE_CHANNEL

__all__ = ["listen_for_wakeups"]

_log = logging.getLogger("qjsflow.worker")
_RECONNECT_S = (0.1, 5.0)  # the first pause after a lost listener, and the longest


async def listen_for_wakeups(conninfo: str, on_wake: Callable[[], None]) -> None:
    """Call `on_wake` at each notification on the channel, until cancelled; reconnect after a
    lost connection (waking once then: what came meanwhile is unknown)."""
    psycopg = importlib.import_module("psycopg")
    pause = _RECONNECT_S[0]
    while True:
        try:
            connection = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
            async with connection:
                await connection.execute(f"LISTEN {WAKE_CHANNEL}")
                pause = _RECONNECT_S[0]
                on_wake()
                async for _ in connection.notifies():
                    on_wake()
        except psycopg.Error as error:
            _log.warning("the wake-up listener lost its connection (%s); polling meanwhile",
                         type(error).__name__)  # fmt: skip
        await asyncio.sleep(pause)  # a backoff before reconnecting, not synchronisation
        pause = min(pause * 2, _RECONNECT_S[1])
