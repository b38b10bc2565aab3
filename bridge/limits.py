"""The per-run limits (docs/SANDBOX.md, Limits), in one frozen dataclass shared by host and
sandbox."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits"]

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """Every limit fails the run with an error naming it; the host and other runs carry on."""

    memory_bytes: int = 64 * MiB
    compute_per_drive_s: float = 5.0
    compute_per_run_s: float = 30.0
    # Wall-clock time of one drive: what timers (setTimeout) may wait, sleeping, in all.
    drive_wall_s: float = 30.0
    # A step's retry due within this is waited for inside the drive, in the same context.
    retry_in_drive_ms: int = 1000
    stack_bytes: int = 1 * MiB
    value_bytes: int = 1 * MiB  # a step result, tool args or result, event payload, run output
    value_depth: int = 64
    steps_per_run: int = 10_000
    step_name_chars: int = 256
    notify_per_drive: int = 100
    ops_per_drive: int = 20_000
    jobs_per_drive: int = 5_000_000
    log_bytes_per_drive: int = 256 * 1024
    log_lines_per_drive: int = 1_000  # every console call counts, an empty one too
    log_lines_per_run: int = 10_000
    # Every recorded result of a run travels into the executor on each replay: bounded so a
    # run that worked once can always be replayed within `memory_bytes`. 0 means a quarter
    # of `memory_bytes` (16 MiB by default), which is also the most it may be.
    journal_bytes_per_run: int = 0

    def __post_init__(self) -> None:
        if self.journal_bytes_per_run == 0:
            object.__setattr__(self, "journal_bytes_per_run", self.memory_bytes // 4)
        if self.journal_bytes_per_run * 4 > self.memory_bytes:
            raise ValueError(
                "journal_bytes_per_run must be at most a quarter of memory_bytes: a replay "
                "holds the whole journal in the executor's memory"
            )
