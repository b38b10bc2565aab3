"""The statements of scope databases replicated through the journal
(runner/scopedb/replication.py decides): each scope's numbered changes and its latest image."""

from __future__ import annotations

from typing import Any

from qjsflow.runner.store.flow_rows import FlowStatements

__all__ = ["ScopeChangeStatements"]


class ScopeChangeStatements(FlowStatements):
    def scope_head(self, scope: str) -> int:
        """The scope's latest version (0: no change yet)."""
        row = self._one(
            "SELECT coalesce(max(version), 0) FROM scope_changes WHERE scope = ?", (scope,)
        )
        return int(row[0])

    def scope_changes_after(self, scope: str, version: int, limit: int) -> list[tuple[int, str]]:
        """The scope's changes after `version`, in order."""
        rows = self._db.execute(
            "SELECT version, change FROM scope_changes WHERE scope = ? AND version > ?"
            " ORDER BY version LIMIT ?",
            (scope, version, limit),
        ).fetchall()
        return [(int(number), str(change)) for number, change in rows]

    def append_scope_change(self, scope: str, version: int, change: str, now: int) -> bool:
        """Record the scope's change `version`; False when another writer recorded that
        version first (the caller's transaction must not go on)."""
        row = self._one(
            "INSERT INTO scope_changes (scope, version, change, created_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING RETURNING 1",
            (scope, version, change, now),
        )
        return row is not None

    def scope_image(self, scope: str) -> tuple[int, bytes] | None:
        """The scope's latest image and the version it holds."""
        row: Any = self._one(
            "SELECT version, image FROM scope_images WHERE scope = ? ORDER BY version DESC LIMIT 1",
            (scope,),
        )
        return None if row is None else (int(row[0]), bytes(row[1]))

    def store_scope_image(self, scope: str, version: int, image: bytes, now: int) -> int:
        """Keep `image` as the scope at `version`; the changes before it and older images go
        (the change `version` stays: the scope's head is never lost). Bytes freed."""
        self._db.execute(
            "INSERT INTO scope_images (scope, version, image, created_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            (scope, version, image, now),
        )
        freed = self._one(
            "SELECT coalesce(sum(length(change)), 0) FROM scope_changes"
            " WHERE scope = ? AND version < ?",
            (scope, version),
        )
        older = self._one(
            "SELECT coalesce(sum(length(image)), 0) FROM scope_images"
            " WHERE scope = ? AND version < ?",
            (scope, version),
        )
        self._db.execute(
            "DELETE FROM scope_changes WHERE scope = ? AND version < ?", (scope, version)
        )
        self._db.execute(
            "DELETE FROM scope_images WHERE scope = ? AND version < ?", (scope, version)
        )
        return int(freed[0]) + int(older[0])
