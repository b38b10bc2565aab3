"""A PostgreSQL journal's connection sends its statements on libpq's pipeline itself
(runner/store/pg_connection.py): each text prepared once on the server and run by name after,
a bounded number kept, none kept across a change of the schema, none behind a transaction
pooler; a statement's error is psycopg's, told at the next answer read, and the connection
goes on after it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from qjsflow.runner.store.backends import Backend, open_backend

pytestmark = pytest.mark.slow

PREPARED = "SELECT name, statement, generic_plans + custom_plans FROM pg_prepared_statements"


def _prepared(c: Any) -> dict[str, int]:
    """The session's prepared statements: each text, and how many times it ran."""
    return {row[1]: row[2] for row in c.execute(PREPARED).fetchall()}


async def test_a_statement_is_prepared_once_and_run_by_name_after(pg_backend: Backend) -> None:
    sql = "SELECT ? + 1, ?"

    def work(c: Any) -> list[Any]:
        return [c.execute(sql, (n, f"s{n}")).fetchone() for n in range(7)]

    assert await pg_backend.run(work) == [(n + 1, f"s{n}") for n in range(7)]
    prepared = await pg_backend.run(_prepared)
    assert prepared["SELECT $1 + 1, $2"] == 7
    # Statements with nothing to plan again are not prepared.
    assert not [text for text in prepared if text.startswith(("BEGIN", "COMMIT", "SET"))]


async def test_past_its_bound_the_least_recently_used_statement_is_deallocated(
    pg_backend: Backend,
) -> None:
    def work(c: Any) -> list[Any]:
        return [c.execute(f"SELECT ? + {n}", (1,)).fetchone()[0] for n in range(260)]

    assert await pg_backend.run(work) == [1 + n for n in range(260)]
    prepared = await pg_backend.run(_prepared)
    assert 150 < len(prepared) <= 201  # (the count's own statement among them)
    assert "SELECT $1 + 0" not in prepared
    assert "SELECT $1 + 259" in prepared
    # The first, deallocated, is prepared again under a new name when sent again.
    assert await pg_backend.run(lambda c: c.execute("SELECT ? + 0", (5,)).fetchone()) == (5,)


async def test_a_schema_change_drops_what_was_prepared_before_it(pg_backend: Backend) -> None:
    """A prepared `SELECT *` whose table gains a column would fail ("cached plan must not
    change result type"): after a schema change nothing prepared before is used again."""

    def before(c: Any) -> Any:
        c.execute("CREATE TABLE t (a INT)")
        c.execute("INSERT INTO t VALUES (?)", (1,))
        return c.execute("SELECT * FROM t WHERE a = ?", (1,)).fetchall()

    def after(c: Any) -> Any:
        c.execute("ALTER TABLE t ADD COLUMN b TEXT")
        return c.execute("SELECT * FROM t WHERE a = ?", (1,)).fetchall()

    assert await pg_backend.run(before) == [(1,)]
    assert await pg_backend.run(after) == [(1, None)]


async def test_an_error_is_psycopgs_told_at_the_next_answer_and_the_connection_goes_on(
    pg_backend: Backend,
) -> None:
    def made(c: Any) -> None:
        c.execute("CREATE TABLE u (k INT PRIMARY KEY)")
        c.execute("INSERT INTO u VALUES (?)", (1,))
        c.sync()

    def twice(c: Any) -> None:
        c.execute("BEGIN")
        c.execute("INSERT INTO u VALUES (?)", (2,))
        c.execute("INSERT INTO u VALUES (?)", (1,))  # sent, not yet refused
        c.execute("INSERT INTO u (k) VALUES (?)", (3,))  # skipped, its preparation too
        try:
            c.sync()
        finally:
            c.execute("ROLLBACK")

    await pg_backend.run(made)
    with pytest.raises(psycopg.errors.UniqueViolation):
        await pg_backend.run(twice)
    rows = await pg_backend.run(lambda c: c.execute("SELECT k FROM u ORDER BY k").fetchall())
    assert rows == [(1,)]
    # The statement whose preparation was skipped is prepared when sent again.
    await pg_backend.run(lambda c: (c.execute("INSERT INTO u (k) VALUES (?)", (3,)), c.sync()))
    assert await pg_backend.all("SELECT k FROM u ORDER BY k") == [(1,), (3,)]


async def test_behind_a_transaction_pooler_nothing_is_prepared(pg_url: str) -> None:
    """A statement prepared on one server session may be run on another behind PgBouncer's
    transaction pooling (docs/OPERATIONS.md): there, each is parsed where it runs."""
    pooled = await open_backend(f"{pg_url}?qjsflow_pooling=transaction")
    try:
        rows = await pooled.run(lambda c: [c.execute("SELECT ?", (n,)).fetchone() for n in (1, 2)])
        assert rows == [(1,), (2,)]
        assert await pooled.run(_prepared) == {}
    finally:
        await pooled.close()
