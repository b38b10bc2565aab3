"""Crash points for the exactly-once tests of db.sql, loaded into a worker subprocess through
`--tools tests.crash_points:TOOLS` (it binds no tools).

With QJSFLOW_TEST_CRASH_AFTER_SQL set, the worker kills itself (SIGKILL) right after the scope
database applied a statement containing that text, before the journal records the result:
the window in which an effect is done but not yet remembered.

With QJSFLOW_TEST_CRASH_AT_REPLICA=OP (a replicated scope database), the worker kills itself as
it asks its replica for OP: `finish` — a change is committed in the journal, the replica's
transaction still open; `apply` — a catch-up's changes sent, their answer not read.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from qjsflow.runner.scopedb.client import ScopeDatabases, SqlOutcome

CRASH_AFTER_SQL = "QJSFLOW_TEST_CRASH_AFTER_SQL"
_marker = os.environ.get(CRASH_AFTER_SQL, "")
_execute = ScopeDatabases.execute


async def _execute_then_crash(self: ScopeDatabases, scope: str, **call: Any) -> SqlOutcome:
    outcome = await _execute(self, scope, **call)
    if _marker and _marker in call["sql"]:
        os.kill(os.getpid(), signal.SIGKILL)
    return outcome


ScopeDatabases.execute = _execute_then_crash  # type: ignore[method-assign]

CRASH_AT_REPLICA = "QJSFLOW_TEST_CRASH_AT_REPLICA"
_replica_op = os.environ.get(CRASH_AT_REPLICA, "")
_ask_replica = ScopeDatabases.ask_replica


async def _ask_then_crash(
    self: ScopeDatabases, slot: object, scope: str, asked: dict[str, Any]
) -> Any:
    if _replica_op == "finish" == asked.get("op") and asked.get("version") is not None:
        os.kill(os.getpid(), signal.SIGKILL)  # the journal has the change; the replica not yet
    answer = await _ask_replica(self, slot, scope, asked)
    if _replica_op == "apply" == asked.get("op") and asked.get("changes"):
        os.kill(os.getpid(), signal.SIGKILL)  # the replica applied them; no one heard of it
    return answer


ScopeDatabases.ask_replica = _ask_then_crash  # type: ignore[method-assign]
TOOLS: dict[str, Any] = {}
