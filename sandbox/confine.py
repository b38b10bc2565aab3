"""The executor's second layer: once it has started, the process can make no system call a
drive does not need (docs/SANDBOX.md, Confinement).

Escaping QuickJS would put an attacker's code in this process, with its user id. These layers
make that worth nothing: a seccomp filter that kills the process on any system call outside
`ALLOWED` (no open, socket, connect, execve, fork, ptrace, mount, …), reading only its request
pipe and writing only its answer pipe and stderr; Landlock, where the kernel has it, with no
filesystem access at all and no TCP bind or connect; no new privileges, not dumpable, no core
files. Both go through small ctypes layers: libseccomp (the system library) and the Landlock
system calls.

`ALLOWED` was derived from `strace -f` of the executors under the sandbox, runner and
Cloudflare test suites (every system call made after the ready frame), and is the one table to
review: what each call is for is written beside it.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
from collections.abc import Sequence
from dataclasses import dataclass

from qjsflow.sandbox.confinement_modes import CONFINEMENT_MODES

__all__ = [
    "ALLOWED",
    "CONFINEMENT_MODES",
    "Layers",
    "confine",
    "confine_paths",
]


# name -> why a drive needs it. `read` and `write` are further limited to their descriptors.
ALLOWED: dict[str, str] = {
    "read": "the request pipe (fd 0) only",
    "write": "the answer pipe and stderr only",
    "mmap": "memory: the allocator and QuickJS's heap",
    "munmap": "memory",
    "mremap": "memory",
    "mprotect": "memory",
    "madvise": "memory: the allocator returning pages",
    "brk": "memory",
    "futex": "the interpreter's locks (the binding's idle worker thread waits on one)",
    "clock_gettime": "compute and wall-clock budgets (process CPU time is a real system call)",
    "clock_nanosleep": "a drive's own timers (setTimeout) sleep",
    "nanosleep": "the same, on older C libraries",
    "gettid": "the C library's locks",
    "getpid": "the C library",
    "rt_sigprocmask": "signal masks around the C library's locks",
    "rt_sigaction": "the interpreter's signal handlers",
    "rt_sigreturn": "returning from a signal handler",
    "sched_yield": "lock back-off",
    "close": "closing a pipe at exit",
    "exit": "a thread ending",
    "exit_group": "the process ending",
}
_FORBIDDEN_EXAMPLES = ("openat", "socket", "connect", "execve", "clone", "ptrace", "mount")

_SCMP_ACT_KILL_PROCESS = 0x80000000
_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_CMP_EQ = 4
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_DUMPABLE = 4
# landlock_create_ruleset, landlock_add_rule, landlock_restrict_self
_LANDLOCK_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}
_FS_EXECUTE = 1 << 0
_FS_READ = (1 << 2) | (1 << 3)  # READ_FILE, READ_DIR
_FS_FILE = 0b111 | (1 << 14) | (1 << 15)  # EXECUTE, WRITE_FILE, READ_FILE, TRUNCATE, IOCTL_DEV
_LANDLOCK_CREATE_RULESET_VERSION = 1


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]  # fmt: skip


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]  # fmt: skip


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass(frozen=True, slots=True)
class Layers:
    """What the process got; `missing` says why a layer is absent."""

    seccomp: bool = False
    landlock_abi: int = 0  # 0: not applied
    no_new_privs: bool = False
    missing: tuple[str, ...] = ()

    def as_wire(self) -> dict[str, object]:
        return {"seccomp": self.seccomp, "landlockAbi": self.landlock_abi,
                "noNewPrivs": self.no_new_privs, "missing": list(self.missing)}  # fmt: skip


def confine(answer_fd: int, mode: str) -> Layers:
    """Apply every layer this kernel offers; raise `RuntimeError` in `require` mode when one
    is missing. After it, the process may make only the calls in `ALLOWED`, and holds no
    descriptor but 0, 1, 2 and `answer_fd` (the limit is lowered to them)."""
    highest = max(answer_fd, 2) + 1
    if mode == "off":
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest, highest))
        return Layers(missing=("confinement is off (an operator's setting)",))
    libc = ctypes.CDLL(None, use_errno=True)
    missing: list[str] = []
    no_new_privs = _harden(libc)
    if not no_new_privs:
        missing.append("no_new_privs could not be set")
    try:  # loaded first: after Landlock no file can be read. By its soname (ctypes.util.
        # find_library would run ldconfig or a compiler).
        library: ctypes.CDLL | None = ctypes.CDLL("libseccomp.so.2")
    except OSError:
        library = None
        missing.append("libseccomp is not installed (Debian: libseccomp2)")
    abi = _landlock(libc)  # it needs a descriptor of its own for a moment
    if abi == 0:
        missing.append("Landlock is not offered by this kernel")
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest, highest))
    seccomp = library is not None and _seccomp(library, answer_fd, missing)
    if mode == "require" and missing:
        raise RuntimeError("confinement required but missing: " + "; ".join(missing))
    return Layers(seccomp, abi, no_new_privs, tuple(missing))


def _landlock(libc: ctypes.CDLL, grants: Sequence[tuple[str, str]] = ()) -> int:
    """No filesystem access but `grants` (a path, and "read", "execute" — read and run — or
    "write": everything but running), and no TCP bind or connect, for this process and its
    children. The Landlock ABI applied, or 0 when the kernel has none."""
    numbers = _LANDLOCK_SYSCALLS.get(platform.machine())
    if numbers is None:
        return 0
    create, add_rule, restrict = numbers
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(create, None, ctypes.c_size_t(0), ctypes.c_uint(
        _LANDLOCK_CREATE_RULESET_VERSION))  # fmt: skip
    if abi < 1:
        return 0
    # Every filesystem right this ABI knows is handled: what no rule grants is denied.
    every = (1 << {1: 13, 2: 14, 3: 15, 4: 15}.get(abi, 16)) - 1
    attr = _RulesetAttr(every, 0b11 if abi >= 4 else 0, 0b11 if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint(0))
    if ruleset < 0:
        return 0
    try:
        for path, kind in grants:
            rights = {"write": every & ~_FS_EXECUTE, "read": _FS_READ,
                      "execute": _FS_READ | _FS_EXECUTE}[kind]  # fmt: skip
            if not os.path.isdir(path):  # a file takes file rights only
                rights &= _FS_FILE
            rights &= every
            beneath = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneath(rights, beneath)
                if libc.syscall(add_rule, ctypes.c_int(ruleset), ctypes.c_int(1),
                                ctypes.byref(rule), ctypes.c_uint(0)) != 0:  # fmt: skip
                    return 0
            finally:
                os.close(beneath)
        if libc.syscall(restrict, ctypes.c_int(ruleset), ctypes.c_uint(0)) != 0:
            return 0
    finally:
        os.close(ruleset)
    return int(abi)


def confine_paths(grants: Sequence[tuple[str, str]], mode: str = "best-effort") -> Layers:
    """A process that must open files (the scope database, the bundler): Landlock granting
    only `grants` (a path and "read", "execute" or "write"; missing paths are skipped), no TCP,
    no new privileges, no core files. For `mode` "off", nothing."""
    if mode == "off":
        return Layers(missing=("confinement is off (an operator's setting)",))
    libc = ctypes.CDLL(None, use_errno=True)
    no_new_privs = _harden(libc)
    present = [(path, kind) for path, kind in grants if os.path.exists(path)]
    abi = _landlock(libc, present) if no_new_privs else 0
    missing = () if abi else ("Landlock is not offered by this kernel",)
    return Layers(False, abi, no_new_privs, missing)


def _harden(libc: ctypes.CDLL) -> bool:
    """No core files, not dumpable, no new privileges (Landlock and seccomp need the last);
    whether no_new_privs took."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    return bool(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0)


def _seccomp(library: ctypes.CDLL, answer_fd: int, missing: list[str]) -> bool:
    library.seccomp_init.restype = ctypes.c_void_p
    library.seccomp_init.argtypes = [ctypes.c_uint32]
    library.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    library.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                               ctypes.c_uint, ctypes.POINTER(_ArgCmp)]  # fmt: skip
    library.seccomp_load.argtypes = [ctypes.c_void_p]
    library.seccomp_release.argtypes = [ctypes.c_void_p]
    context = library.seccomp_init(_SCMP_ACT_KILL_PROCESS)
    if not context:
        missing.append("seccomp could not be initialised")
        return False
    try:
        fds = {"read": (0,), "write": tuple(sorted({1, 2, answer_fd}))}
        for call in ALLOWED:
            number = library.seccomp_syscall_resolve_name(call.encode())
            if number < 0:
                continue  # not a system call on this architecture
            for fd in fds.get(call, (None,)):
                rule = (_ArgCmp * 1)(_ArgCmp(0, _SCMP_CMP_EQ, fd, 0)) if fd is not None else None
                count = 0 if fd is None else 1
                if library.seccomp_rule_add_array(context, _SCMP_ACT_ALLOW, number, count,
                                                  rule) != 0:  # fmt: skip
                    missing.append(f"seccomp refused the rule for {call}")
                    return False
        if library.seccomp_load(context) != 0:
            missing.append("the kernel refused the seccomp filter")
            return False
        return True
    finally:
        library.seccomp_release(context)
