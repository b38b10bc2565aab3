"""Schedules: each firing starts one run, named by its nominal time, whichever worker fires
it; downtime within the catch-up window is made up, older firings are skipped and counted;
the overlap policies; cron in a time zone. In process on a virtual clock, and with real worker
processes on both journals."""

from __future__ import annotations

import asyncio
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from qjsflow.bridge import InvalidInput
from qjsflow.runner import Runner, RunnerConfig, StartRunInput
from qjsflow.runner.operations.schedule_spec import parse_schedule
from tests.conftest import PROJECT_ROOT, FakeClock
from tests.worker_pool import Workers

QUICK = "export default async (event) => event.payload;"


@pytest.fixture
async def runner(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Runner]:
    """A runner on the virtual clock with the `tick` workflow published (this module's)."""
    async with Runner.open(tmp_path / "j.db", RunnerConfig(clock=clock)) as opened:
        await opened.publish("acme", {"workflows/tick.ts": QUICK})
        yield opened


async def _runs(runner: Runner) -> list[str]:
    return sorted(run.run_id for run in await runner.list(scope="acme", workflow="tick"))


async def test_two_runners_fire_each_tick_once(tmp_path: Path, clock: FakeClock) -> None:
    one = await Runner.connect(tmp_path / "j.db", RunnerConfig(clock=clock))
    await one.publish("acme", {"workflows/tick.ts": QUICK})
    two = await Runner.connect(tmp_path / "j.db", RunnerConfig(clock=clock))
    try:
        made = await one.set_schedule("acme", "every-minute", "tick",
                                      {"every_s": 60, "overlap": "allow_all", "input": 7})  # fmt: skip
        assert made.next_at is not None
        clock.advance(60 * 3 + 1)
        now = int(clock() * 1000)
        await asyncio.gather(one.fire_schedules(now), two.fire_schedules(now))
        await asyncio.gather(one.fire_schedules(now), two.fire_schedules(now))  # again: nothing
        runs = await _runs(one)
        first = int(made.next_at * 1000)
        assert runs == sorted(f"s-every-minute-{first + n * 60_000}" for n in range(3))
        shown = await one.schedule("acme", "every-minute")
        assert (shown.fired, shown.skipped) == (3, 0)
        assert shown.next_at == (first + 3 * 60_000) / 1000
    finally:
        await two.aclose()
        await one.aclose()


async def test_downtime_past_the_catch_up_window_is_skipped_and_counted(
    runner: Runner, clock: FakeClock
) -> None:
    made = await runner.set_schedule("acme", "s", "tick",
                                     {"every_s": 60, "overlap": "allow_all", "catchup_s": 150})  # fmt: skip
    clock.advance(60 * 10 + 1)  # ten firings missed while no worker ran
    now = int(clock() * 1000)
    await runner.fire_schedules(now)
    nominals = [int((made.next_at or 0) * 1000) + n * 60_000 for n in range(10)]
    young = [at for at in nominals if at >= now - 150_000]
    shown = await runner.schedule("acme", "s")
    assert (shown.fired, shown.skipped) == (len(young), 10 - len(young))
    assert await _runs(runner) == sorted(f"s-s-{at}" for at in young)  # once each


@pytest.mark.parametrize(
    ("overlap", "runs", "skipped"),
    [("skip", 1, 2), ("allow_all", 3, 0), ("buffer_one", 1, 1), ("cancel_other", 3, 0)],
)
async def test_each_overlap_policy_under_a_run_that_goes_on(
    runner: Runner, clock: FakeClock, overlap: str, runs: int, skipped: int
) -> None:
    """The runs a firing starts are recorded, not driven: the first is still going when the
    next two come due."""
    await runner.set_schedule("acme", "s", "tick", {"every_s": 60, "overlap": overlap})
    for _ in range(3):
        clock.advance(60)
        await runner.fire_schedules(int(clock() * 1000))
    shown = await runner.schedule("acme", "s")
    assert (len(await _runs(runner)), shown.skipped) == (runs, skipped)
    if overlap == "buffer_one":  # one firing kept, started once the run ends
        assert shown.buffered_at is not None
        await runner.terminate(shown.last_run or "", scope="acme")
        await runner.fire_schedules(int(clock() * 1000))
        assert len(await _runs(runner)) == 2
    if overlap == "cancel_other":
        statuses = [str((await runner.get(r, scope="acme")).status)
                    for r in await _runs(runner)]  # fmt: skip
        assert statuses.count("cancelled") == 2


async def test_pause_trigger_delete_and_cron_in_a_time_zone(
    runner: Runner, clock: FakeClock
) -> None:
    shown = await runner.set_schedule("acme", "morning", "tick",
                                      {"cron": "0 9 * * *", "timezone": "Europe/Paris"})  # fmt: skip
    assert shown.next_at is not None
    at = datetime.fromtimestamp(shown.next_at, tz=UTC)
    assert (at.hour, at.minute) == (8, 0)  # 09:00 in Paris, winter time
    paused = await runner.pause_schedule("acme", "morning")
    assert (paused.paused, paused.next_at) == (True, None)
    clock.advance(2 * 86_400)
    await runner.fire_schedules(int(clock() * 1000))
    assert await _runs(runner) == []
    again = await runner.pause_schedule("acme", "morning", paused=False)
    assert again.next_at is not None
    assert again.next_at > clock()  # what it missed while paused is not made up
    triggered = await runner.trigger_schedule("acme", "morning")
    assert await _runs(runner) == [triggered.run_id]
    assert await runner.delete_schedule("acme", "morning")
    assert await runner.schedules(scope="acme") == []


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({}, "give cron (five fields) or every_s"),
        ({"cron": "* * *"}, "is not a five-field cron expression"),
        ({"cron": "61 * * * *"}, "is not a five-field cron expression"),
        ({"every_s": 0}, "every_s is a number of seconds"),
        ({"every_s": 60, "timezone": "Mars/Olympus"}, "is not an IANA time zone"),
        ({"every_s": 60, "overlap": "queue"}, "overlap is one of skip, buffer_one"),
        ({"every_s": 60, "colour": "red"}, "unknown key 'colour'"),
    ],
)
def test_bad_settings_are_named(settings: dict[str, object], said: str) -> None:
    with pytest.raises(InvalidInput, match=re.escape(said)):
        parse_schedule(settings, "schedule 's'")


@pytest.mark.slow
async def test_real_workers_and_a_restarted_one_fire_each_tick_once(
    workers: Workers, api: Runner
) -> None:
    """Two worker processes, one killed and another started, on one journal: every nominal
    tick between the first and the last has exactly one run, none missed, none twice."""
    await api.publish("acme", {"workflows/tick.ts": CALLS})
    made = await api.set_schedule("acme", "tick", "tick", {"every_s": 1, "overlap": "allow_all"})
    first, second = workers.spawn(), workers.spawn()
    await _ticks(workers, 3)  # each tick's run calls a tool, which says so as it runs
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    third = workers.spawn()
    await _ticks(workers, 5)
    for process in (second, third):
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    runs = [run.run_id for run in await api.list(scope="acme", workflow="tick", limit=10_000)]
    nominals = sorted(int(run_id.rsplit("-", 1)[1]) for run_id in runs)
    assert len(set(nominals)) == len(nominals)
    assert nominals[0] == int((made.next_at or 0) * 1000)
    assert nominals == list(range(nominals[0], nominals[-1] + 1, 1000))  # every tick, once
    shown = await api.schedule("acme", "tick")
    assert shown.fired == len(nominals)


CALLS = """
export default async (event, step) =>
  step.tool("say", "append", { run: event.instanceId, step: "tick" });
"""


async def _ticks(workers: Workers, count: int) -> None:
    """Until `count` more tick runs have called their tool (a run made again after the kill
    may call it twice: counted once)."""
    seen: set[str] = set()
    while len(seen) < count:
        seen.add(await workers.tool_call(lambda line: line.endswith(" tick")))


@pytest.mark.slow
def test_the_schedules_command(tmp_path: Path) -> None:
    def qjsflow(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "qjsflow.runner.cli", "--db", str(tmp_path / "j.db"), *args],
            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    tree = tmp_path / "src" / "workflows"
    tree.mkdir(parents=True)
    (tree / "tick.ts").write_text(QUICK)
    assert qjsflow("publish", str(tree.parent), "--scope", "acme").returncode == 0
    made = qjsflow("--json", "schedules", "set", "nightly", "--scope", "acme", "--workflow",
                   "tick", "--cron", "0 3 * * *", "--timezone", "Europe/Paris", "--input", "5")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert orjson.loads(made.stdout)["spec"]["input"] == 5
    listed = qjsflow("schedules", "list")
    assert "nightly  tick      cron 0 3 * * * Europe/Paris" in listed.stdout, listed.stdout
    assert "(paused)" in qjsflow("schedules", "pause", "nightly", "--scope", "acme").stdout
    assert "next in" in qjsflow("schedules", "unpause", "nightly", "--scope", "acme").stdout
    triggered = qjsflow("schedules", "trigger", "nightly", "--scope", "acme")
    assert "started run s-nightly-" in triggered.stdout
    shown = qjsflow("schedules", "show", "nightly", "--scope", "acme").stdout
    assert "last runs:" in shown
    assert triggered.stdout.split("started run ")[1].strip() in shown  # its run, listed
    assert shown.count("  then in ") == 2  # the two firings after the next
    shown_json = orjson.loads(
        qjsflow("--json", "schedules", "show", "nightly", "--scope", "acme").stdout
    )
    assert len(shown_json["runs"]) == 1
    assert len(shown_json["schedule"]["upcoming"]) == 2
    for args, said in (
        (("set", "x", "--workflow", "nope", "--every", "60"), "has no workflow 'nope'"),
        (("set", "x", "--workflow", "tick", "--cron", "99 * * * *"), "not a five-field cron"),
        (("set", "x", "--workflow", "tick"), "give cron (five fields) or every_s"),
        (("show", "gone"), "has no schedule 'gone'"),
        (("delete", "gone"), "has no schedule 'gone'"),
    ):
        refused = qjsflow("schedules", *args, "--scope", "acme")
        assert (refused.returncode, said in refused.stderr) == (2, True), refused.stderr
    assert qjsflow("schedules", "delete", "nightly", "--scope", "acme").returncode == 0
    assert qjsflow("--json", "schedules", "list").stdout.strip() == "[]"
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"input": 1, "run_id": "b1"}\n\n{"workflow": "nope"}\n{"input": 2}\n')
    done = qjsflow("start", "tick", "--scope", "acme", "--snapshot", "latest", "--batch",
                   str(batch))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "2 created, 0 existed, 1 refused"
    assert "item 2: " in done.stdout
    assert "has no workflow 'nope'" in done.stdout
    again = qjsflow("--json", "start", "tick", "--scope", "acme", "--snapshot", "latest",
                    "--batch", str(batch))  # fmt: skip
    assert [item["outcome"] for item in orjson.loads(again.stdout)][:2] == ["existed", "refused"]


async def test_a_projects_wrangler_schedules_become_schedules(
    tmp_path: Path, clock: FakeClock
) -> None:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "index.ts").write_text(
        'import { WorkflowEntrypoint } from "cloudflare:workers";\n'
        "export class Digest extends WorkflowEntrypoint { async run() { return 1; } }\n"
    )
    (root / "wrangler.jsonc").write_text(
        '{"main": "src/index.ts", "workflows": [{"name": "digest", "binding": "DIGEST",'
        ' "class_name": "Digest", "schedules": ["0 6 * * *", "*/30 * * * *"]}]}'
    )
    async with Runner.open(tmp_path / "j.db", RunnerConfig(clock=clock)) as runner:
        await runner.publish("acme", root)
        shown = await runner.schedules(scope="acme")
        assert [(s.name, s.workflow, s.spec["cron"], s.spec["timezone"]) for s in shown] == [
            ("digest-1", "digest", "0 6 * * *", "UTC"),
            ("digest-2", "digest", "*/30 * * * *", "UTC"),
        ]
        (root / "wrangler.jsonc").write_text(
            '{"main": "src/index.ts", "workflows": [{"name": "digest", "class_name": "Digest",'
            ' "schedules": ["every day"]}]}'
        )
        with pytest.raises(Exception, match="schedules are not a list of five-field cron"):
            await runner.publish("acme", root)


async def test_jitter_delays_each_firing_alike_and_backfill_starts_what_is_missing(
    runner: Runner,
) -> None:
    made = await runner.set_schedule(
        "acme", "j", "tick", {"every_s": 60, "overlap": "allow_all", "jitter_s": 30}
    )
    nominal = int((made.next_at or 0) * 1000)
    spec = parse_schedule(made.spec, "j")
    due = spec.due_at("j", nominal)
    assert nominal <= due < nominal + 30_000
    assert due == parse_schedule(made.spec, "again").due_at("j", nominal)  # every worker's
    await runner.fire_schedules(due - 1)  # its nominal time has passed, its share not yet
    assert await _runs(runner) == []
    await runner.fire_schedules(due)
    assert await _runs(runner) == [f"s-j-{nominal}"]
    # A backfill over that hour starts each firing with no run yet, once.
    since, until = nominal / 1000 - 3600, nominal / 1000
    started = await runner.backfill_schedule("acme", "j", since=since, until=until)
    assert len(started) == 61
    again = await runner.backfill_schedule("acme", "j", since=since, until=until)
    assert again == started
    assert len(await _runs(runner)) == 61  # the one fired before is one of them


async def test_a_batch_of_1000_starts_in_one_transaction_answers_each(runner: Runner) -> None:
    await runner.start(StartRunInput("acme", "tick", "latest", 0, "b-0"), drive=False)
    requests = [StartRunInput("acme", "tick", "latest", n, f"b-{n}") for n in range(1000)]
    requests[13] = StartRunInput("acme", "nope", "latest", 13, "b-13")
    requests[200] = StartRunInput("acme", "tick", "latest", 200, "bad id!")
    requests[300] = StartRunInput("acme", "tick", "latest", "other input", "b-0")
    requests[400] = StartRunInput("acme", "tick", "no-such-snapshot", 1, "b-400")
    items = await runner.start_batch(requests)
    outcomes = {item.index: (item.outcome, item.error) for item in items}
    assert outcomes[0] == ("existed", None)  # the same start made before
    assert outcomes[13][0] == outcomes[200][0] == outcomes[300][0] == "refused"
    assert "has no workflow 'nope'" in (outcomes[13][1] or "")
    assert "invalid run id" in (outcomes[200][1] or "").lower()
    assert "already exists with a different input" in (outcomes[300][1] or "")
    assert outcomes[400][0] == "refused"
    created = [i for i, (outcome, _) in outcomes.items() if outcome == "created"]
    assert len(created) == 1000 - 5
    assert len(await runner.list(scope="acme", workflow="tick", limit=2000)) == 996


async def test_runs_carry_tags_and_are_found_by_them(
    runner: Runner, tmp_path: Path, clock: FakeClock
) -> None:
    for n, (customer, tier) in enumerate([("c1", "gold"), ("c2", "gold"), ("c1", "free")]):
        await runner.start(StartRunInput("acme", "tick", "latest", n, f"t{n}",
                                         tags={"customer": customer, "tier": tier}),
                           drive=False)  # fmt: skip
    found = await runner.list(scope="acme", tags={"customer": "c1"})
    assert [run.run_id for run in found] == ["t0", "t2"]
    both = await runner.list(scope="acme", tags={"customer": "c1", "tier": "gold"})
    assert [run.run_id for run in both] == ["t0"]
    assert await runner.tags("t1", scope="acme") == [("customer", "c2"), ("tier", "gold")]
    for tags, said in (({"bad key!": "x"}, "invalid tag key"),
                       ({"k": "x" * 300}, "printable text of 256")):  # fmt: skip
        with pytest.raises(InvalidInput, match=said):
            await runner.start(StartRunInput("acme", "tick", "latest", 0, tags=tags))
    await runner.terminate("t0", scope="acme")
    clock.advance(10)
    assert (await runner.prune(older_than_s=1, scope="acme")).runs == 1
    with sqlite3.connect(tmp_path / "j.db") as journal:
        # Found through the tags' index, not a scan of the runs; a pruned run's tags go too.
        plan = " ".join(str(row) for row in journal.execute(
            "EXPLAIN QUERY PLAN SELECT run_id FROM run_tags WHERE key = ? AND value = ?",
            ("customer", "c1"),
        ))  # fmt: skip
        assert "run_tags_by_value" in plan
        left = journal.execute("SELECT DISTINCT run_id FROM run_tags ORDER BY 1").fetchall()
        assert left == [("acme/t1",), ("acme/t2",)]


async def test_a_schedules_runs_are_found_by_it_and_runs_by_a_time_range(
    runner: Runner, clock: FakeClock
) -> None:
    early = await runner.start(StartRunInput("acme", "tick", "latest", 0, "early"),
                               drive=False)  # fmt: skip
    await runner.set_schedule("acme", "s", "tick", {"every_s": 60, "overlap": "allow_all"})
    clock.advance(121)
    await runner.fire_schedules(int(clock() * 1000))
    fired = await runner.list(scope="acme", tags={"schedule": "s"})
    assert len(fired) == 2
    assert all(run.run_id.startswith("s-s-") for run in fired)
    before = await runner.list(scope="acme", until=early.created_at)
    assert [run.run_id for run in before] == ["early"]
    after = await runner.list(scope="acme", since=early.created_at + 1)
    assert sorted(run.run_id for run in after) == sorted(run.run_id for run in fired)
