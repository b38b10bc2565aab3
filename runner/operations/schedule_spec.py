"""What a schedule says (docs/OPERATIONS.md, Schedules): when it fires — a five-field cron
expression read by croniter in a time zone (UTC by default), or an interval — from when to when,
what to do when the run it started last has not ended (`overlap`), how far back missed
firings are made up after downtime (`catchup_s`), and the input its runs get.

A firing's nominal time names its run (`s-NAME-NOMINAL_MS`), so two workers, a restart or a
clock jump never start it twice.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from qjsflow.bridge import InvalidInput, dumps_text, loads

__all__ = ["OVERLAP_POLICIES", "SCHEDULE_NAME", "ScheduleSpec", "parse_schedule", "run_id_of"]

OVERLAP_POLICIES = ("skip", "buffer_one", "allow_all", "cancel_other")
SCHEDULE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_KEYS = frozenset({"cron", "every_s", "timezone", "overlap", "catchup_s", "start_at", "end_at",
                   "input", "snapshot", "paused", "jitter_s"})  # fmt: skip
_MAX_CATCHUP_S = 366 * 86_400.0
_MAX_FIRINGS = 1000  # nominal times one look walks through (older ones are counted skipped)


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    cron: str | None = None  # five fields, croniter's dialect
    every_s: float | None = None  # or an interval, from `start_at` (or the epoch)
    timezone: str = "UTC"
    overlap: str = "skip"  # what a firing does while the schedule's last run has not ended
    catchup_s: float = 3600.0  # missed firings younger than this start after downtime
    start_at: float | None = None  # seconds since the epoch
    end_at: float | None = None
    input: Any = None
    snapshot: str = "latest"  # the code its runs start on: an id, a prefix, or `latest`
    paused: bool = False
    jitter_s: float = 0.0  # each firing waits a fixed share of this, made from its time

    def text(self) -> str:
        return dumps_text(asdict(self))

    @classmethod
    def from_text(cls, text: str) -> ScheduleSpec:
        return parse_schedule(loads(text), "the stored schedule")

    def after(self, at_ms: int) -> int | None:
        """The first nominal firing after `at_ms` (ms), or None past `end_at`."""
        start_ms = int((self.start_at or 0) * 1000)
        if at_ms < start_ms:
            at_ms = start_ms - 1
        if self.every_s is not None:
            step = int(self.every_s * 1000)
            nominal = start_ms + ((at_ms - start_ms) // step + 1) * step
        else:
            zone = ZoneInfo(self.timezone)
            base = datetime.fromtimestamp(at_ms / 1000, tz=UTC).astimezone(zone)
            nominal = int(croniter(self.cron, base).get_next(datetime).timestamp() * 1000)
        if self.end_at is not None and nominal > self.end_at * 1000:
            return None
        return nominal

    def due_at(self, name: str, nominal_ms: int) -> int:
        """When a firing starts: its nominal time, plus its share of `jitter_s` (the same for
        every worker: made from the schedule's name and the nominal time)."""
        if not self.jitter_s:
            return nominal_ms
        digest = hashlib.sha256(f"{name}\n{nominal_ms}".encode()).digest()
        return nominal_ms + int.from_bytes(digest[:8], "big") % int(self.jitter_s * 1000)

    def firings(self, first_ms: int, until_ms: int) -> Iterator[int]:
        """Nominal times from `first_ms` (itself one) to `until_ms`, at most `_MAX_FIRINGS`."""
        at: int | None = first_ms
        for _ in range(_MAX_FIRINGS):
            if at is None or at > until_ms:
                return
            yield at
            at = self.after(at)


def run_id_of(name: str, nominal_ms: int) -> str:
    """The run a firing starts: the same for every worker that fires it."""
    return f"s-{name}-{nominal_ms}"


def parse_schedule(document: object, where: str) -> ScheduleSpec:
    """A schedule's settings, checked: `InvalidInput` naming each problem, one per line."""
    if not isinstance(document, Mapping):
        raise InvalidInput(f"{where} must be an object of settings")
    problems = [f"{where}: unknown key {key!r} (use {', '.join(sorted(_KEYS))})"
                for key in sorted(set(document) - _KEYS)]  # fmt: skip
    cron, every = document.get("cron"), document.get("every_s")
    if (cron is None) == (every is None):
        problems.append(f"{where}: give cron (five fields) or every_s (seconds), one of them")
    if cron is not None and (not isinstance(cron, str) or len(cron.split()) != 5
                             or not croniter.is_valid(cron)):  # fmt: skip
        problems.append(f"{where}: cron {str(cron)[:80]!r} is not a five-field cron expression")
    if every is not None and not _number(every, 1.0, _MAX_CATCHUP_S):
        problems.append(f"{where}: every_s is a number of seconds from 1 to a year")
    zone = document.get("timezone", "UTC")
    try:
        ZoneInfo(str(zone))
    except (ZoneInfoNotFoundError, ValueError):
        problems.append(f"{where}: timezone {str(zone)[:80]!r} is not an IANA time zone")
    overlap = document.get("overlap", "skip")
    if overlap not in OVERLAP_POLICIES:
        problems.append(f"{where}: overlap is one of {', '.join(OVERLAP_POLICIES)}")
    jitter = document.get("jitter_s", 0.0)
    if not _number(jitter, 0.0, 86_400.0):
        problems.append(f"{where}: jitter_s is a number of seconds from 0 to a day")
    catchup = document.get("catchup_s", 3600.0)
    if not _number(catchup, 0.0, _MAX_CATCHUP_S):
        problems.append(f"{where}: catchup_s is a number of seconds from 0 to a year")
    for key in ("start_at", "end_at"):
        if document.get(key) is not None and not _number(document[key], 0.0, 2**33):
            problems.append(f"{where}: {key} is a time in seconds since the epoch")
    if not isinstance(document.get("snapshot", "latest"), str):
        problems.append(f"{where}: snapshot is a snapshot id, a prefix, or latest")
    if not isinstance(document.get("paused", False), bool):
        problems.append(f"{where}: paused is true or false")
    if problems:
        raise InvalidInput("\n".join(problems))
    return ScheduleSpec(
        cron=cron, every_s=None if every is None else float(every), timezone=str(zone),
        overlap=str(overlap), catchup_s=float(catchup),
        start_at=_seconds(document.get("start_at")), end_at=_seconds(document.get("end_at")),
        input=document.get("input"), snapshot=str(document.get("snapshot", "latest")),
        paused=bool(document.get("paused", False)), jitter_s=float(jitter),
    )  # fmt: skip


def _number(value: object, low: float, high: float) -> bool:
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and math.isfinite(value) and low <= value <= high)  # fmt: skip


def _seconds(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]
