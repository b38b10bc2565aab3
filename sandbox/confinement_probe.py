"""For the sandbox's tests only: an executor that, when its first drive arrives, makes one
system call its filter forbids (argv[4] names which), as code escaping QuickJS would, or
writes lines to its stderr (`stderr`) as an executor that meets an internal error does.

Started by a test through `PoolConfig(entry="qjsflow.sandbox.confinement_probe")` with the
call's name appended to its arguments; no production path starts it. Each forbidden call must
end with the kernel killing the process (SIGSYS); if the call were allowed, the drive goes on
and completes, so the test fails.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys

from qjsflow.sandbox import confine, executor

STDERR_LINES = 30  # written by the `stderr` probe


def _misbehave(call: str) -> object:
    match call:
        case "open":
            return os.open("/etc/hostname", os.O_RDONLY)
        case "socket":
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        case "connect":  # a socket made before the filter would not help: connect is refused
            return socket.create_connection(("127.0.0.1", 9), timeout=1)
        case "execve":
            return os.execv("/bin/true", ["true"])
        case "fork":
            return os.fork()
        case "write-file":  # a descriptor it does not own
            return os.write(5, b"x")
        case "kill":  # signalling another process
            os.kill(os.getppid(), 0)
            return None
        case "no-seccomp":
            return None
        case "stderr":  # more lines than are logged, each with what a terminal would act on
            for n in range(STDERR_LINES):
                print(f"line {n}: \x1b[2J\rforged \u202e{'x' * 600}", file=sys.stderr, flush=True)
            return None
    raise ValueError(call)


def _without_seccomp(library: object, answer_fd: int, missing: list[str]) -> bool:
    missing.append("seccomp withheld by the confinement probe")
    return False


def main() -> None:
    call = sys.argv.pop(4)
    if call == "no-seccomp":  # as on a kernel without it: what the `require` setting refuses
        confine._seccomp = _without_seccomp

    def attempt() -> None:
        # Refused with an error rather than a kill (the descriptor limit, say) means the
        # filter let the call through: the drive then goes on, and the test fails.
        with contextlib.suppress(OSError):
            _misbehave(call)

    executor.main(before_drive=attempt)


if __name__ == "__main__":
    main()
