"""Flow control a workflow declares (docs/OPERATIONS.md, Flow control): how many of its runs
run at once per key, how fast they start, which starts are merged or skipped, and in what
order they leave the queue. Declared per workflow in `qjsflow.json`
(`{"workflows": {"NAME": {"flow_control": {...}}}}`), in a wrangler file's `workflows[]` entry
(`"flow_control": {...}`, a qjsflow extension), or given to one start:

    {"concurrency": {"limit": 2, "key": "event.payload.customerId"},
     "rateLimit": {"limit": 100, "period": "1 minute", "key": "event.payload.customerId"},
     "throttle": {"limit": 10, "period": 60},
     "debounce": {"period": "30 seconds", "key": "event.payload.userId"},
     "singleton": {"key": "event.payload.accountId", "mode": "skip"},
     "priority": 5}

A key is a path into the run's input (`event.payload.a.b`, or `input.a.b`); runs whose paths
give equal JSON values share a key, a missing path gives `null`. Periods are seconds or a
duration as `step.sleep` takes it ("30 seconds", "1 minute"). The journal enforces them for
every worker (runner/tenancy/flow_gates.py).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qjsflow.bridge import dumps_text

__all__ = [
    "PRIORITY_RANGE", "PRIORITY_RULE", "FlowControl", "FlowKeys", "Gate", "flow_from_json",
    "is_priority", "key_value",
]  # fmt: skip

_KINDS = frozenset({"concurrency", "rateLimit", "throttle", "debounce", "singleton", "priority"})
_PATH = re.compile(r"^(event\.payload|input)((?:\.[A-Za-z0-9_$-]{1,64}){0,8})$")
_DURATION = re.compile(
    r"^([0-9]+(?:\.[0-9]+)?)\s*(millisecond|second|minute|hour|day|week|ms|s|m|h|d|w)s?$"
)
_UNIT_S = {
    "millisecond": 0.001, "ms": 0.001, "second": 1, "s": 1, "minute": 60, "m": 60,
    "hour": 3600, "h": 3600, "day": 86_400, "d": 86_400, "week": 604_800, "w": 604_800,
}  # fmt: skip
_MAX_PERIOD_S = 7 * 86_400.0
_MAX_LIMIT = 100_000
PRIORITY_RANGE = (-1000, 1000)
_MAX_KEY_TEXT = 200


@dataclass(frozen=True, slots=True)
class Gate:
    """One limit and the key it is counted by (None: the whole workflow is one key)."""

    limit: int
    key: str | None = None
    period_s: float = 0.0  # rate limits and throttles: the window
    mode: str = ""  # singletons: skip | cancel; rate limits: refuse | queue

    def to_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"limit": self.limit}
        if self.key is not None:
            shown["key"] = self.key
        if self.period_s:
            shown["period"] = self.period_s
        if self.mode:
            shown["mode"] = self.mode
        return shown


@dataclass(frozen=True, slots=True)
class FlowControl:
    concurrency: Gate | None = None
    rate_limit: Gate | None = None  # starts past the limit are refused (or, mode queue, queued)
    throttle: Gate | None = None  # starts past the limit wait for room in the window
    debounce: Gate | None = None  # limit unused: a start within the period replaces the pending
    singleton: Gate | None = None  # at most one live run of a key; mode skip or cancel
    priority: int = 0  # higher leaves queues first, within its scope

    @property
    def gated(self) -> bool:
        """Whether a start of it goes through the queue (priority alone does not)."""
        return any(
            g is not None
            for g in (self.concurrency, self.rate_limit, self.throttle, self.debounce,
                      self.singleton)
        )  # fmt: skip

    def to_json(self) -> str:
        named = {
            "concurrency": self.concurrency, "rateLimit": self.rate_limit,
            "throttle": self.throttle, "debounce": self.debounce, "singleton": self.singleton,
        }  # fmt: skip
        document: dict[str, Any] = {
            kind: {k: v for k, v in gate.to_json().items() if k in _GATE_KEYS[kind]}
            for kind, gate in named.items() if gate is not None
        }  # fmt: skip
        if self.priority:
            document["priority"] = self.priority
        return dumps_text(document)

    def keys(self, run_input: Any) -> FlowKeys:
        """Each gate's key for a run of `run_input`."""

        def of(gate: Gate | None) -> str | None:
            return None if gate is None else key_value(gate.key, run_input)

        rate = self.rate_limit or self.throttle
        return FlowKeys(of(self.concurrency), of(self.singleton), of(rate), of(self.debounce))


@dataclass(frozen=True, slots=True)
class FlowKeys:
    """The keys one run is counted under (None where its workflow sets no such gate)."""

    concurrency: str | None
    singleton: str | None
    rate: str | None
    debounce: str | None


def key_value(path: str | None, run_input: Any) -> str:
    """The key a path picks from a run's input: the JSON of the value found (`null` when the
    path is missing), hashed when long."""
    value = run_input
    if path is not None:
        for name in path.split(".")[2 if path.startswith("event.") else 1 :]:
            value = value.get(name) if isinstance(value, Mapping) else None
    if path is None:
        value = None
    text = dumps_text(value)
    if len(text) > _MAX_KEY_TEXT:
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return text


PRIORITY_RULE = f"priority is a whole number from {PRIORITY_RANGE[0]} to {PRIORITY_RANGE[1]}"


def is_priority(value: object) -> bool:
    """Whether `value` is a run's priority (`PRIORITY_RANGE`, higher first)."""
    low, high = PRIORITY_RANGE
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def flow_from_json(document: object, where: str) -> FlowControl:
    """Flow control as written, checked: `ValueError` naming each problem, one per line."""
    if not isinstance(document, Mapping):
        raise ValueError(f"{where} is an object of some of {', '.join(sorted(_KINDS))}")
    problems = [f"{where}: unknown key {str(key)[:80]!r} (use {', '.join(sorted(_KINDS))})"
                for key in document if key not in _KINDS]  # fmt: skip
    gates: dict[str, Gate | None] = {}
    for kind in ("concurrency", "rateLimit", "throttle", "debounce", "singleton"):
        value = document.get(kind)
        gates[kind] = None if value is None else _gate(kind, value, f"{where}.{kind}", problems)
    priority = document.get("priority", 0)
    if not is_priority(priority):
        problems.append(f"{where}.{PRIORITY_RULE}")
        priority = 0
    if gates["rateLimit"] is not None and gates["throttle"] is not None:
        problems.append(f"{where}: give rateLimit or throttle, not both")
    if problems:
        raise ValueError("\n".join(problems))
    return FlowControl(
        concurrency=gates["concurrency"], rate_limit=gates["rateLimit"],
        throttle=gates["throttle"], debounce=gates["debounce"], singleton=gates["singleton"],
        priority=priority,
    )  # fmt: skip


_GATE_KEYS = {
    "concurrency": {"limit", "key"},
    "rateLimit": {"limit", "period", "key", "mode"},
    "throttle": {"limit", "period", "key"},
    "debounce": {"period", "key"},
    "singleton": {"key", "mode"},
}
_MODES = {"rateLimit": ("refuse", "queue"), "singleton": ("skip", "cancel")}


def _gate(kind: str, value: object, where: str, problems: list[str]) -> Gate | None:
    allowed = _GATE_KEYS[kind]
    if not isinstance(value, Mapping) or set(value) - allowed:
        problems.append(f"{where} is an object of {', '.join(sorted(allowed))}")
        return None
    limit = value.get("limit", 1)
    if "limit" in allowed and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _MAX_LIMIT
    ):
        problems.append(f"{where}.limit is a whole number from 1 to {_MAX_LIMIT}")
    key = value.get("key")
    if key is not None and (not isinstance(key, str) or not _PATH.fullmatch(key)):
        problems.append(f"{where}.key {str(key)[:80]!r} is a path into the input: "
                        "event.payload.NAME[.NAME...] or input.NAME[...]")  # fmt: skip
    period = 0.0
    if "period" in allowed:
        found = _period(value.get("period"))
        if found is None:
            problems.append(f"{where}.period is seconds or a duration (\"1 minute\"), "
                            "up to a week")  # fmt: skip
        period = found or 0.0
    modes = _MODES.get(kind, ("",))
    mode = value.get("mode", modes[0])
    if mode not in modes:
        problems.append(f"{where}.mode is one of {', '.join(modes)}")
    return Gate(limit if isinstance(limit, int) else 1, key, period, str(mode))


def _period(value: object) -> float | None:
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value.strip().lower())
        if match is not None:
            seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds is None or not math.isfinite(seconds) or not 0 < seconds <= _MAX_PERIOD_S:
        return None
    return seconds
