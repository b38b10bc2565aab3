"""A crash point for the exactly-once tests of db.sql, loaded into a worker subprocess through
`--tools tests.crash_points:TOOLS` (it binds no tools).

With QJSFLOW_TEST_CRASH_AFTER_SQL set, the worker kills itself (SIGKILL) right after the scope
database applied a statement containing that text, before the journal records the result:
the window in which an effect is done but not yet remembered.
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
TOOLS: dict[str, Any] = {}
