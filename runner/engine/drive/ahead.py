"""A start's first drive begun while the start's transaction commits ("driven ahead").

A start (`Runner.start`) writes its run, takes the run's lease and begins its first drive in
one transaction. What that transaction writes is nearly always foreseen: the run is new, and
what the start before it read is still so (runner/operations/start_reads.py). So the drive
is sent to an executor at once, from the run as the start will write it
(`Creation.foresee`), while the transaction commits, rather than after it.

Nothing the drive does reaches the journal or the world before the start is found written
as foreseen (`StartAhead.confirmed`): the host services none of its ops, its end writes
nothing and its heartbeat renews nothing until then. A start written otherwise (the run
was there already, a read it presumed changed, the transaction failed) drops the drive
unwritten — its ops are answered as a lost lease's are, so that its body suspends — and the
run is driven as the transaction left it, or the start answers as it would have.

Only a plain start is driven ahead, on a PostgreSQL journal (a SQLite commit is over before a
drive could be sent: ahead, a sequential run gained nothing there): in a scope with no
budgets to admit it under or charge its drive to, and no limit on its runs at once, of a
workflow with no gate (flow control).
Its author code may run once for nothing (a start of a run id already there); that costs
compute no budget counts, which is why budgeted scopes are left out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from qjsflow.bridge.types import Answer, OpEnvelope, needs_answer
from qjsflow.runner.engine.drive.beginning import Taken
from qjsflow.runner.engine.drive.kept import OpenSteps
from qjsflow.runner.engine.host import PARKED
from qjsflow.runner.store import Lease, LeaseLost, RunRecord
from qjsflow.sandbox.pool import Host

__all__ = ["StartAhead", "foreseen_start"]


def foreseen_start(run: RunRecord, worker_id: str) -> Taken:
    """What a start's transaction returns for a new plain run (`take_and_begin`): the first
    lease of the run, and a beginning with no journal, no open step and no budget used."""
    return Lease(run.run_id, worker_id, 1), (run, (), OpenSteps((), ()), {}), True


class StartAhead:
    """A drive begun ahead of its start's transaction (`start`), from what it foresaw."""

    def __init__(self, start: asyncio.Future[Taken | None], foreseen: Taken) -> None:
        self.start = start
        self.foreseen = foreseen
        # Its outcome is always looked at (`confirmed`, `held`), or dropped here: a caller
        # cancelled meanwhile must not leave an exception nobody retrieved.
        start.add_done_callback(_retrieved)

    @property
    def lease(self) -> Lease:
        return self.foreseen[0]

    async def confirmed(self) -> None:
        """Once the start is written as foreseen; `LeaseLost` if it was not (the foreseen
        lease is not the drive's). The start goes on if the caller is cancelled."""
        try:
            taken = await asyncio.shield(self.start)
        except asyncio.CancelledError:
            if self.start.cancelled():  # (only ever by the loop's end)
                raise LeaseLost(self.lease) from None
            raise
        except Exception:
            raise LeaseLost(self.lease) from None
        if taken != self.foreseen:
            raise LeaseLost(self.lease)

    async def settled(self) -> None:
        """Once the start's transaction is over, however it ended."""
        await asyncio.wait([self.start])

    @property
    def held(self) -> bool:
        """Whether the start is over and wrote what was foreseen: its lease is the drive's."""
        start = self.start
        if not start.done() or start.cancelled() or start.exception() is not None:
            return False
        return start.result() == self.foreseen

    def gating(self, host: Host) -> Host:
        """`host`, servicing no op before the start is confirmed. Not confirmed, every op is
        answered as a lost lease's would be (`PARKED`: the body suspends where it is, and its
        executor is not killed), and the drive's end drops it (`LeaseLost`)."""

        async def gated(ops: Sequence[OpEnvelope]) -> Sequence[Answer]:
            try:
                await self.confirmed()
            except LeaseLost:
                return [Answer(op.id, PARKED, None) for op in ops if needs_answer(op.op)]
            return await host(ops)

        return gated


def _retrieved(start: asyncio.Future[Taken | None]) -> None:
    if not start.cancelled():
        start.exception()
