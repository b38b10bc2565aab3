"""Prometheus metrics of a runner process (`qjsflow worker --metrics-port`), through
prometheus-client when it is installed (the `otel` extra); without it, every call is a no-op.

Labels are bounded: outcomes, kinds, reasons and statuses are small fixed sets, scopes are the
operator's tenants; a run id is never a label.
"""

from __future__ import annotations

from typing import Any

__all__ = ["METRICS", "Metrics"]

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class _Nothing:
    """Stands in for a metric when prometheus-client is absent."""

    def labels(self, *args: Any, **kwargs: Any) -> _Nothing:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, value: float) -> None:
        pass

    def clear(self) -> None:
        pass


class Metrics:
    """The process's metrics: no-ops until `enable()` (a worker with `--metrics-port` calls
    it; prometheus-client is imported only then: it would add ~65 ms to every command)."""

    def __init__(self) -> None:
        self.available = False
        self._define(None)

    def enable(self) -> bool:
        """Record from now on, in prometheus-client's default registry; False when it is not
        installed. Once only."""
        if self.available:
            return True
        try:
            import prometheus_client  # noqa: PLC0415  (optional: the otel extra)
        except ImportError:
            return False
        self._define(prometheus_client)
        self.available = True
        return True

    def _define(self, prometheus: Any) -> None:
        def make(kind: str, name: str, text: str, labels: tuple[str, ...] = (), **more: Any) -> Any:
            if prometheus is None:
                return _Nothing()
            return getattr(prometheus, kind)(name, text, labels, **more)

        self.drives = make("Counter", "qjsflow_drives", "Drives made, by how they ended",
                           ("outcome",))  # fmt: skip
        self.drive_seconds = make("Histogram", "qjsflow_drive_seconds",
                                  "Wall time of a drive", buckets=_LATENCY)  # fmt: skip
        self.steps = make("Counter", "qjsflow_steps", "Step attempts and calls settled, by kind "
                          "and outcome", ("kind", "outcome"))  # fmt: skip
        self.step_seconds = make("Histogram", "qjsflow_step_seconds",
                                 "Wall time of a step attempt or call", ("kind",),
                                 buckets=_LATENCY)  # fmt: skip
        self.journal_seconds = make("Histogram", "qjsflow_journal_commit_seconds",
                                    "Wall time of a journal commit (with its fsync when durable)",
                                    ("durable",), buckets=_LATENCY)  # fmt: skip
        self.sql_seconds = make("Histogram", "qjsflow_db_sql_seconds",
                                "Time author SQL took in the scope databases",
                                buckets=_LATENCY)  # fmt: skip
        self.executors = make("Gauge", "qjsflow_executors", "Executor processes, by state",
                              ("state",))  # fmt: skip
        self.workers = make("Gauge", "qjsflow_workers",
                            "Workers registered in the journal, by state (live, gone, stopped)",
                            ("state",))  # fmt: skip
        self.executors_killed = make(
            "Counter", "qjsflow_executors_killed", "Executors killed or dead, by reason",
            ("reason",),
        )  # fmt: skip
        self.lease_takeovers = make(
            "Counter",
            "qjsflow_lease_takeovers",
            "Runs taken over from a driver that never released them",
        )
        self.presumptions_failed = make(
            "Counter",
            "qjsflow_journal_presumptions_failed",
            "Transactions that presumed (rows absent, a fence held, reads unchanged) and were"
            " run again carefully",
        )
        self.limits_hit = make("Counter", "qjsflow_limits_hit", "Runs failed by a limit, by kind",
                               ("kind",))  # fmt: skip
        self.scheduling_lag = make(
            "Gauge",
            "qjsflow_scheduling_lag_seconds",
            "How long the earliest due timer has been due (0: none)",
        )
        self.runs = make("Gauge", "qjsflow_runs", "Runs in the journal, by scope and status",
                         ("scope", "status"))  # fmt: skip
        self.scope_usage = make(
            "Counter", "qjsflow_scope_usage",
            "What this process's drives charged to each scope's budgets, by measure (steps,"
            " drives, compute_s, tool_calls, fetches, sql_s, journal_bytes)",
            ("scope", "measure"),
        )  # fmt: skip
        self.schedule_firings = make(
            "Counter", "qjsflow_schedule_firings", "Schedules' firings, started or skipped",
            ("scope", "outcome"),
        )  # fmt: skip
        self.schedule_lag = make(
            "Histogram", "qjsflow_schedule_lag_seconds",
            "How long after its nominal time (and jitter) a firing's run was started",
        )  # fmt: skip
        self.throttled = make("Counter", "qjsflow_runs_throttled",
                              "Runs parked because their scope spent a budget, by budget",
                              ("scope", "budget"))  # fmt: skip

    def limit_kind(self, message: str) -> str | None:
        """The kind of limit a failure names, if it names one."""
        text = message.lower()
        for kind in ("compute", "memory", "stack", "journal", "steps", "log", "wall", "sql"):
            if kind in text and ("limit" in text or "budget" in text):
                return kind
        return None


METRICS = Metrics()
