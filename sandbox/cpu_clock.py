"""An executor's compute as the host reads it from /proc: what the per-drive budget, the
watchdog and each run's charge count.

`/proc/PID/schedstat` holds the time the process's main thread has run, in nanoseconds: an
executor runs all author code on its main thread (the QuickJS binding's other thread only
waits on a lock), and the kernel answers with three numbers, where `/proc/PID/stat` gathers
some fifty (~30 µs less a read after an idle moment, twice a drive). Where the kernel keeps
no such statistics (the file reads zeros) or has no such file, `/proc/PID/stat`'s user and
system time serve, in clock ticks (10 ms). Both are the kernel's same count of the time run;
neither includes the slice the process is running in now. RLIMIT_CPU bounds the whole process
whatever is read here (sandbox/executor.py, `limit_self`).

The file is opened at the first read and kept for the process's life: read at offset 0 it is
made anew (one call, not three), and it never names another process that reuses the pid.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["CpuClock"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class CpuClock:
    """The compute of the process `pid` (its own child, not yet reaped: the pid is still its
    own when the file is opened). Raises OSError if neither file can be opened."""

    def __init__(self, pid: int) -> None:
        self._fd = -1
        with contextlib.suppress(OSError):
            self._fd = os.open(f"/proc/{pid}/schedstat", os.O_RDONLY)
        self.nanoseconds = self._fd >= 0 and self._run_ns() > 0
        if not self.nanoseconds:
            if self._fd >= 0:
                os.close(self._fd)
            self._fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)

    def _run_ns(self) -> int:
        return int(os.pread(self._fd, 64, 0).split(None, 1)[0])

    def seconds(self) -> float:
        """Its compute so far; OSError once the process is reaped."""
        if self.nanoseconds:
            return self._run_ns() / 1e9
        fields = os.pread(self._fd, 4096, 0).rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS

    def close(self) -> None:
        os.close(self._fd)
