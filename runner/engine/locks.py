"""One asyncio lock per key (a run's drives, one at a time in a process), kept only while
someone holds or awaits it."""

from __future__ import annotations

import asyncio

__all__ = ["KeyedLocks"]


class KeyedLocks:
    """One asyncio lock per key, kept only while someone holds or awaits it: a runner with
    thousands of suspended runs keeps no per-run state."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def users(self) -> dict[str, int]:
        """How many hold or await each key's lock now (a key no one does is not kept)."""
        return {key: users for key, (_, users) in self._locks.items()}

    def hold(self, key: str) -> _Held:
        return _Held(self._locks, key)


class _Held:
    """`KeyedLocks.hold`: a plain class (a generator-made context manager cost a drive
    ~10 µs more, cold)."""

    __slots__ = ("_key", "_lock", "_locks")

    def __init__(self, locks: dict[str, tuple[asyncio.Lock, int]], key: str) -> None:
        self._locks = locks
        self._key = key

    async def __aenter__(self) -> None:
        lock, users = self._locks.get(self._key) or (asyncio.Lock(), 0)
        self._locks[self._key] = (lock, users + 1)
        self._lock = lock
        try:
            await lock.acquire()
        except BaseException:
            self._leave()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._lock.release()
        self._leave()

    def _leave(self) -> None:
        lock, users = self._locks[self._key]
        if users == 1:
            del self._locks[self._key]
        else:
            self._locks[self._key] = (lock, users - 1)
