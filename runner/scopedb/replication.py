"""Scope databases across machines: the host's side (the server's is replica.py).

The journal holds each scope's database as numbered changes (`scope_changes`, from 1, with
no gap) and, from time to time, an image of it (`scope_images`) that replaces the changes
before it. A worker's local file is a replica: before any statement it is brought to the
journal's head (`catch_up`: the changes it lacks, in order, or the latest image first when
those were pruned — a new machine, a wiped folder). A statement that writes is held open on
the replica while the host commits its change in the journal, in the transaction that
records the call's result, as the scope's next version; another machine that took that version
first makes it `ChangeLost`: rolled back, caught up, run again.
"""

from __future__ import annotations

import contextlib
import os
import time
import zlib
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from qjsflow.bridge.codec import loads
from qjsflow.runner.store import JournalStore, JournalTransaction

__all__ = ["IMAGE_EVERY", "Ask", "ChangeLost", "Replication"]

# Changes between images: a replica that starts from nothing applies at most this many.
IMAGE_EVERY = 1000
_BATCH = 500  # changes sent to a replica at a time

Ask = Callable[[dict[str, Any]], Awaitable[Any]]  # a request to the replica; its answer


class ChangeLost(Exception):
    """Another machine recorded the scope's next version first: nothing of this call was
    recorded; its replica rolls it back, catches up and runs it again."""

    def __init__(self, scope: str, version: int) -> None:
        super().__init__(f"scope {scope!r}: version {version} was recorded by another writer")


class Replication:
    """The journal's side of every scope replica of this process."""

    def __init__(self, store: JournalStore, root: Path, *, image_every: int = IMAGE_EVERY) -> None:
        self.store = store
        self.root = root
        self.image_every = image_every
        self.images = 0  # images this process stored

    async def head(self, scope: str) -> int:
        """The scope's latest version in the journal."""
        head: int = await self.store.read(lambda tx: tx.scope_head(scope))
        return head

    async def catch_up(self, scope: str, have: int, ask: Ask) -> int:
        """Bring a replica at `have` to the journal's head; the version it reached."""
        while True:
            changes = await self.store.read(partial(_changes_after, scope=scope, version=have))
            if not changes:
                return have
            if changes[0][0] != have + 1:  # those it lacks were folded into an image
                have = await self._restore(scope, ask)
                continue
            shown = [{"version": number, "change": loads(text)} for number, text in changes]
            reply = await ask({"op": "apply", "changes": shown})
            have = int(reply["version"])
            if len(changes) < _BATCH:
                return have

    async def _restore(self, scope: str, ask: Ask) -> int:
        found = await self.store.read(lambda tx: tx.scope_image(scope))
        if found is None:
            raise RuntimeError(f"scope {scope!r}: the journal lacks changes and has no image")
        version, image = found
        name = f".{scope}.restore"
        descriptor = os.open(self.root / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(zlib.decompress(image))
        await ask({"op": "restore", "file": name})
        return version

    async def append(self, scope: str, version: int, change: str) -> bool:
        """Record a change of the scope's own (not a call's) as `version`; False when
        another writer took it."""
        now = int(time.time() * 1000)
        done: bool = await self.store.transact(
            partial(_append, scope=scope, version=version, change=change, now=now)
        )
        return done

    def due_image(self, version: int) -> bool:
        return version % self.image_every == 0

    async def keep_image(self, scope: str, ask: Ask, now: int) -> int:
        """Store an image of a replica just brought to a version (its number), compressed;
        the changes before it are pruned. Bytes freed in the journal."""
        name = f".{scope}.image"
        reply = await ask({"op": "image", "file": name})
        path = self.root / name
        try:
            data = zlib.compress(path.read_bytes(), 6)
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        version = int(reply["version"])
        freed: int = await self.store.transact(
            partial(_keep, scope=scope, version=version, image=data, now=now)
        )
        self.images += 1
        return freed


def _changes_after(tx: JournalTransaction, *, scope: str, version: int) -> list[tuple[int, str]]:
    return tx.scope_changes_after(scope, version, _BATCH)


def _append(tx: JournalTransaction, *, scope: str, version: int, change: str, now: int) -> bool:
    return tx.append_scope_change(scope, version, change, now)


def _keep(tx: JournalTransaction, *, scope: str, version: int, image: bytes, now: int) -> int:
    """The image stored, what it replaces pruned; the scope's stored bytes counted for its
    budgets (docs/TENANCY.md: journal bytes)."""
    freed = tx.store_scope_image(scope, version, image, now)
    tx.charge_usage(scope, [("journal_bytes", 0, float(len(image)))])
    tx.free_journal_bytes(scope, freed)
    return freed
