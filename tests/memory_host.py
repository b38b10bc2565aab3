"""An in-memory host for sandbox tests: services ops like a tiny journal and records them.

Not the product's host (that is `runner/`); it has no retries and no persistence. It exists to
show, through the real executor, what ops a body produces and how replays answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from qjsflow.bridge.failure import StepFailure
from qjsflow.bridge.limits import Limits
from qjsflow.bridge.types import (
    Answer,
    DbSql,
    DriveRequest,
    JournalEntry,
    Log,
    Op,
    OpEnvelope,
    Result,
    StepBegin,
    StepCheck,
    StepNotify,
    StepRecord,
    StepSleep,
    StepTool,
    StepWaitForEvent,
    Suspend,
    Value,
)
from qjsflow.runner.engine.steps import event_value


@dataclass
class MemoryHost:
    entries: list[JournalEntry] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    events: dict[str, list[str]] = field(default_factory=dict)
    tools: dict[str, Callable[[str], str]] = field(default_factory=dict)
    sleeps_due: bool = False
    now_ms: int = 1_000_000

    def request(
        self, bundle: str, payload: str = "{}", limits: Limits | None = None
    ) -> DriveRequest:
        return DriveRequest(
            run_id="run-1",
            workflow="w",
            bundle=bundle,
            input=payload,
            created_at_ms=999_000,
            journal=tuple(self.entries),
            limits=limits or Limits(),
            logs_seen=len(self.logs),
        )

    def keys(self) -> list[str]:
        return [entry.key for entry in self.entries]

    async def __call__(self, ops: Sequence[OpEnvelope]) -> list[Answer]:
        answers = []
        for envelope in ops:
            self.ops.append(envelope.op)
            if isinstance(envelope.op, Log):
                self.logs.append(envelope.op.text)
                continue
            if isinstance(envelope.op, StepBegin):
                continue
            op = envelope.op
            if isinstance(op, StepRecord) and op.settled_at is not None:
                # settled by the sandbox: journaled at the run's clock it used, not answered
                key = f"do:{op.count}:{op.step}"
                self.entries.append(JournalEntry(key, op.value, None, op.settled_at))
                continue
            result, at = self._service(envelope.op)
            answers.append(Answer(envelope.id, result, at))
        return answers

    def _tick(self) -> int:
        self.now_ms += 1000
        return self.now_ms

    def _record(self, key: str, value: str | None, error: StepFailure | None = None) -> int:
        at = self._tick()
        self.entries.append(JournalEntry(key, value, error, at))
        return at

    def _service(self, op: Op) -> tuple[Result, int | None]:
        match op:
            case StepCheck():
                return Value({"hit": False, "attempt": 1, "now": self._tick()}), None
            case StepRecord(step=step, count=count, value=value, error=error):
                final = None if error is None else StepFailure(error.name, error.message, False)
                at = self._record(f"do:{count}:{step}", value, final)
                return (Value(None) if final is None else final), at
            case StepSleep(step=step, count=count):
                if not self.sleeps_due:
                    return Suspend("sleep"), None
                return Value(None), self._record(f"sleep:{count}:{step}", None)
            case StepWaitForEvent(step=step, count=count, type=event_type):
                queue = self.events.get(event_type)
                if not queue:
                    return Suspend("event", event_type), None
                payload = queue.pop(0)
                at = self.now_ms + 1000
                event = event_value(event_type, payload, at)
                return Value(event), self._record(f"waitForEvent:{count}:{step}", event)
            case StepTool(step=step, count=count, address=address, args=args):
                value = self.tools[address](args)
                return Value(value), self._record(f"tool:{count}:{step}", value)
            case StepNotify(step=scope, count=count):
                return Value(None), self._record(f"notify:{count}:{scope}", None)
            case DbSql(step=scope, count=count):
                rows = '{"rows":[],"changes":0,"lastInsertRowid":0}'
                return Value(rows), self._record(f"sql:{count}:{scope}", rows)
        raise AssertionError(f"unexpected op {op}")
