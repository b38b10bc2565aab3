"""An end already certified: the records a quiet end writes behind its answer also check that
the journal holds the run as the driver keeps it; the commit that found so marks the journal
(its WAL-index header, runner/store/wal_mark.py). The next drive from what is kept, if the
journal's mark is still that one (nothing committed since, by anyone), ends without reading
the run. Anything committed since, and anything that changed the run before the records were
written, makes the end read the run, as before."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import pytest

from qjsflow.runner.store import JournalTransaction
from qjsflow.runner.store.wal_mark import WalMarks, follows
from tests.conftest import WAITER, never_leased_early, statements
from tests.journal_reads import execute, query
from tests.test_kept_beginnings import kept_run
from tests.test_leases_taken_late import event_types


def _reads_of_runs(seen: list[tuple[bool, str]]) -> list[str]:
    return [sql for _, sql in seen if "FROM runs" in sql]


async def test_a_drive_from_a_certified_beginning_reads_nothing_before_its_answer(
    tmp_path: Path,
) -> None:
    journal = str(tmp_path / "journal.db")
    async with kept_run(journal, tmp_path, WAITER) as kept:
        runner, key = never_leased_early(kept.first), kept.key
        for _ in range(3):
            events = event_types(journal, key)
            with statements(runner) as seen:
                again = await runner.resume(kept.run_id, scope="acme")
            assert again.status == "waiting"
            assert seen == []  # not a statement of the journal before the answer
            await runner.store.caught_up()
            # Its records, written behind, as for any quiet end.
            assert event_types(journal, key) == [*events, "drive_started", "run_suspended"]


async def test_a_commit_anywhere_since_makes_the_end_read_the_run(tmp_path: Path) -> None:
    """Another process's commit, even of nothing to do with the run, moves the journal's
    mark: the end reads the run (still as kept: it ends quietly), and certifies it again."""
    journal = str(tmp_path / "journal.db")
    async with kept_run(journal, tmp_path, WAITER) as kept:
        runner = never_leased_early(kept.first)
        execute(journal, "CREATE TABLE elsewhere (x)")  # a commit that changes no run
        with statements(runner) as seen:
            assert (await runner.resume(kept.run_id, scope="acme")).status == "waiting"
        assert len(_reads_of_runs(seen)) == 1  # the run read once
        assert not [sql for _, sql in seen if sql.startswith(("BEGIN IMMEDIATE", "UPDATE"))]
        await runner.store.caught_up()
        with statements(runner) as seen:
            assert (await runner.resume(kept.run_id, scope="acme")).status == "waiting"
        assert seen == []  # certified again by the records of the drive before


async def test_an_event_delivered_elsewhere_between_drives_is_taken(
    journal: str, tmp_path: Path
) -> None:
    async with kept_run(journal, tmp_path, WAITER) as kept:
        first, second = never_leased_early(kept.first), kept.second
        assert (await first.resume(kept.run_id, scope="acme")).status == "waiting"
        await first.store.caught_up()
        await second.signal(kept.run_id, "go", "from elsewhere", scope="acme", drive=False)
        done = await first.resume(kept.run_id, scope="acme")
        assert (done.status, done.output) == ("completed", "from elsewhere")


async def test_a_change_before_the_records_are_written_is_not_certified(tmp_path: Path) -> None:
    """A pause asked elsewhere after the answer, before the drive's records are written:
    their commit finds the run changed and certifies nothing, so the next resume reads the
    run, finds the pause asked, and lifts it."""
    journal = str(tmp_path / "journal.db")
    async with kept_run(journal, tmp_path, WAITER) as kept:
        runner, key = never_leased_early(kept.first), kept.key
        assert (await runner.resume(kept.run_id, scope="acme")).status == "waiting"
        # (no await since the answer: the records are not queued yet)
        assert execute(journal, "UPDATE runs SET pause_requested = 1 WHERE run_id = ?", (key,))
        await runner.store.caught_up()
        assert query(journal, "SELECT pause_requested FROM runs WHERE run_id = ?", (key,)) == [(1,)]
        with statements(runner) as seen:
            assert (await runner.resume(kept.run_id, scope="acme")).status == "waiting"
        assert _reads_of_runs(seen)
        assert query(journal, "SELECT pause_requested FROM runs WHERE run_id = ?", (key,)) == [(0,)]
        assert "run_resumed" in event_types(journal, key)


async def test_a_quiet_end_reads_the_run_once_on_either_journal(
    journal: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once in all: SQLite's end reads nothing (certified) and its records look at the run to
    certify it again; a server journal, which has no mark, reads the run at the end and its
    records do not look again (nothing could be certified by it)."""
    async with kept_run(journal, tmp_path, WAITER) as kept:
        runner = never_leased_early(kept.first)
        reads: list[str] = []
        unleased_run = JournalTransaction.unleased_run

        def counted(self: JournalTransaction, run_id: str, *args: Any, **named: Any) -> Any:
            reads.append(run_id)
            return unleased_run(self, run_id, *args, **named)

        monkeypatch.setattr(JournalTransaction, "unleased_run", counted)
        assert (await runner.resume(kept.run_id, scope="acme")).status == "waiting"
        await runner.store.caught_up()
        assert reads == [kept.key]


def _header(change: int, salts: bytes = b"\x01" * 8, init: int = 1) -> bytes:
    head = bytearray(48)
    struct.pack_into("=I", head, 8, change)
    head[12] = init
    head[32:40] = salts
    return bytes(head)


def test_a_mark_follows_only_the_very_next_commit() -> None:
    before = _header(41)
    assert follows(before, _header(42))
    assert not follows(before, _header(43))  # another commit came between
    assert not follows(before, _header(41))  # nothing committed
    assert not follows(before, _header(42, salts=b"\x02" * 8))  # the WAL began afresh
    assert follows(_header(0xFFFFFFFF), _header(0))
    assert not follows(None, _header(42))
    assert not follows(before, None)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (_header(7) + _header(8), "a header being written (its two copies differ)"),
        (_header(7, init=0) * 2, "a header not yet made"),
        (_header(7)[:40], "a file too short"),
    ],
)
def test_no_mark_is_read_from_a_header_that_is_not_whole(
    tmp_path: Path, content: bytes, why: str
) -> None:
    (tmp_path / "journal.db-shm").write_bytes(content)
    assert WalMarks(tmp_path / "journal.db").mark() is None, why


def test_a_whole_header_is_the_mark_and_a_missing_file_none(tmp_path: Path) -> None:
    marks = WalMarks(tmp_path / "journal.db")
    assert marks.mark() is None  # no such file
    (tmp_path / "journal.db-shm").write_bytes(_header(7) * 2 + os.urandom(40))
    assert marks.mark() == _header(7)
    marks.close()
