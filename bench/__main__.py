"""`python -m bench` (or `make bench`): every benchmark, as a markdown table and JSON.

Results go to bench/results/latest.json and latest.md; the README links the latter.
"""

from __future__ import annotations

import asyncio
import platform
import time
from pathlib import Path
from typing import Any

import orjson

from bench import cli, flow, replicas, suite

RESULTS = Path(__file__).with_name("results")


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "skipped (dbos not installed: `pip install -e '.[bench]'`)"
    return f"{value:,.{digits}f}"


def _table(results: dict[str, dict[str, Any]]) -> str:
    s, c, r, k, m = (
        results[name] for name in ("sequential", "concurrent", "replay", "cold", "memory")
    )
    raw, dbos = s["raw_commit_us"], s["dbos_us_per_step"]
    rss = f"{_fmt(m['rss_mib_at_1k'])} / {_fmt(m['rss_mib_at_10k'])} MiB"
    rows = [
        ("sequential: qjsflow per step", f"{_fmt(s['qjsflow_us_per_step'])} µs", ""),
        ("sequential: raw insert+commit (WAL, FULL)", f"{_fmt(raw)} µs", "the limit"),
        ("sequential: DBOS Transact per step", f"{_fmt(dbos)} µs", "same workload"),
        ("sequential: qjsflow / raw commit", _fmt(s["qjsflow_over_limit"], 2), "target 2"),
        ("sequential: qjsflow / DBOS", _fmt(s["qjsflow_over_dbos"], 3), "target 0.2"),
        ("sequential: steps/s", _fmt(s["steps_per_s"], 0), ""),
        ("sequential: runs/s", _fmt(s["runs_per_s"], 0), ""),
        (
            "concurrent (100 runs in flight): steps/s",
            _fmt(c["steps_per_s"], 0),
            f"rounds: {c['steps_per_s_rounds']}; target 4,000",
        ),
        (
            "concurrent: fresh contexts prepared and freed a second, one core",
            _fmt(c["contexts_per_s"], 0),
            "this machine's speed as the rounds ran: a drive's first cost",
        ),
        (
            "concurrent: CPU idle in each round",
            ", ".join(f"{share} %" for share in c["idle_percent_rounds"]),
            "both cores kept busy: a stalled round shows here",
        ),
        ("concurrent: a run's end, p50", f"{c['p50_run_ms']} ms", "from the worker's start"),
        ("concurrent: a run's end, p99", f"{c['p99_run_ms']} ms", ""),
        ("replay of 1,000 steps", f"{_fmt(r['replay_ms'])} ms", "target 50 ms"),
        ("publish to first step (cold)", f"{_fmt(k['publish_to_first_step_ms'])} ms", ""),
        ("a whole drive, warm pool (resume to a wait)", f"{_fmt(k['warm_drive_ms'], 2)} ms", ""),
        (
            "the same, a 400 kB bundle",
            f"{_fmt(k['warm_drive_big_bundle_ms'], 2)} ms",
            "its module builds a 10,000-row table as it loads",
        ),
        ("RSS with 1k / 10k waiting runs", rss, "no per-run memory"),
        ("memory per waiting run", f"{_fmt(m['bytes_per_waiting_run'], 0)} bytes", ""),
    ]
    lines = ["| measure | result | note |", "|---|---:|---|"]
    lines += [f"| {name} | {value} | {note} |" for name, value, note in rows]
    return "\n".join(lines)


def _targets(results: dict[str, dict[str, Any]]) -> str:
    """Each target of the performance work, with its baseline measured in the same run."""
    s, c, k, f, cli = (
        results[name] for name in ("sequential", "concurrent", "cold", "fan_out", "cli")
    )
    raw_us, dbos_us = s["raw_commit_us"], s["dbos_us_per_step"]
    step_us = s["qjsflow_us_per_step"]
    fan_cpu = f["first_drive_cpu_s"]
    concurrent, warm, status = c["steps_per_s"], k["warm_drive_ms"], cli["status_ms"]
    rows: list[tuple[str, str, str, float | None, str, bool | None]] = [
        ("per step, sequential", f"{step_us:,.0f} µs", f"raw durable commit {raw_us:,.0f} µs",
         step_us / raw_us, "≤ 2 x the commit", step_us / raw_us <= 2),
        ("per step, sequential", f"{step_us:,.0f} µs",
         "DBOS Transact: not installed" if dbos_us is None else f"DBOS {dbos_us:,.0f} µs",
         None if dbos_us is None else step_us / dbos_us, "≤ 0.2 x DBOS",
         None if dbos_us is None else step_us / dbos_us <= 0.2),
        ("steps/s, 100 runs in flight", f"{concurrent:,.0f}",
         f"raw durable commits {1e6 / raw_us:,.0f}/s", concurrent * raw_us / 1e6, "≥ 4,000/s",
         concurrent >= 4000),
        ("steps/s, 100 runs in flight", f"{concurrent:,.0f}",
         f"fresh contexts {c['contexts_per_s']:,.0f}/s on one core",
         concurrent / c["contexts_per_s"], "≥ 4,000/s", concurrent >= 4000),
        ("warm resume-to-wait drive", f"{warm:.2f} ms",
         f"raw durable commit {raw_us / 1000:.2f} ms", warm * 1000 / raw_us, "≤ 1.5 ms",
         warm <= 1.5),
        ("4,000-step Promise.all, CPU", f"{fan_cpu:.2f} s",
         f"replaying it {f['replay_cpu_s']:.2f} s", fan_cpu / f["replay_cpu_s"], "≤ 0.5 s",
         fan_cpu <= 0.5),
        ("`qjsflow status`, wall", f"{status:.0f} ms",
         f"python -c pass {cli['python_startup_ms']:.0f} ms",
         status / cli["python_startup_ms"], "≤ 250 ms", status <= 250),
    ]  # fmt: skip
    lines = ["| target | measured | baseline, same run | ÷ baseline | goal | met |",
             "|---|---:|---|---:|---|---|"]  # fmt: skip
    for name, value, baseline, ratio, goal, met in rows:
        shown = "—" if ratio is None else f"{ratio:.2f}"
        verdict = "—" if met is None else ("yes" if met else "no")
        lines.append(f"| {name} | {value} | {baseline} | {shown} | {goal} | {verdict} |")
    return "\n".join(lines)


def _flow_table(results: dict[str, dict[str, Any]]) -> str:
    """Schedules, queues and queries, each beside what it is compared with."""
    lag, queues, queries = results["schedules"], results["queues"], results["queries"]
    poll = lag["poll_interval_ms"]
    rows = [
        ("a scheduled run's start after its nominal time, p50", f"{lag['lag_p50_ms']:.0f} ms",
         f"the worker's poll interval {poll:.0f} ms", lag["lag_p50_ms"] / poll),
        ("the same, p99", f"{lag['lag_p99_ms']:.0f} ms",
         f"{lag['firings']} firings, one a second", lag["lag_p99_ms"] / poll),
        ("a start through a gate with room, driven inline",
         f"{queues['gated_start_ms']:.2f} ms", f"ungated {queues['ungated_start_ms']:.2f} ms",
         queues["gated_start_ms"] / queues["ungated_start_ms"]),
        ("a run queued behind another (concurrency 1), one worker",
         f"{queues['queued_run_ms']:.2f} ms", f"no gate {queues['unqueued_run_ms']:.2f} ms",
         queues["queued_run_ms"] / queues["unqueued_run_ms"]),
    ]  # fmt: skip
    for name in ("by_tag_ms", "by_status_ms", "by_workflow_and_time_ms"):
        shown = name.removesuffix("_ms").replace("_", " ")
        rows.append((f"`list` of {queries['runs']:,} runs, {shown}", f"{queries[name]:.1f} ms",
                     "goal 200 ms", queries[name] / queries["target_ms"]))  # fmt: skip
    lines = ["| measure | result | compared with | ratio |", "|---|---:|---|---:|"]
    lines += [f"| {name} | {value} | {base} | {ratio:.2f} |" for name, value, base, ratio in rows]
    return "\n".join(lines)


def _replica_table(results: dict[str, dict[str, Any]]) -> str:
    """db.sql per statement, replicated against a local file; a new machine's catch-up."""
    costs, caught = results["sql_statements"], results["sql_catch_up"]
    rows = [
        ("a write (INSERT), replicated", f"{costs['replicated_write_ms']:.2f} ms",
         f"local file {costs['local_write_ms']:.2f} ms", costs["write_ratio"]),
        ("a read (SELECT by key), replicated", f"{costs['replicated_read_ms']:.2f} ms",
         f"local file {costs['local_read_ms']:.2f} ms", costs["read_ratio"]),
        (f"catch-up of {caught['changes']:,} changes, a new machine's first read",
         f"{caught['from_changes_s'] * 1000:.0f} ms",
         f"a read caught up {caught['caught_up_read_s'] * 1000:.0f} ms",
         caught["from_changes_s"] / caught["caught_up_read_s"]),
        ("the same from an image", f"{caught['from_image_s'] * 1000:.0f} ms",
         f"a read caught up {caught['caught_up_read_s'] * 1000:.0f} ms",
         caught["from_image_s"] / caught["caught_up_read_s"]),
    ]  # fmt: skip
    lines = ["| measure | result | compared with | ratio |", "|---|---:|---|---:|"]
    lines += [f"| {name} | {value} | {base} | {ratio:.2f} |" for name, value, base, ratio in rows]
    return "\n".join(lines)


async def main() -> None:
    results = {
        "sequential": await suite.sequential(),
        "concurrent": await suite.concurrent(),
        "replay": await suite.replay(),
        "cold": await suite.cold_start(),
        "memory": await suite.memory(),
        "fan_out": await suite.fan_out(),
        "cli": cli.measure(),
        "schedules": await flow.schedule_lag(),
        "queues": await flow.queue_overhead(),
        "queries": await flow.list_queries(),
        "sql_statements": await replicas.statement_costs(),
        "sql_catch_up": await replicas.catch_up(),
    }
    sections = [
        _table(results), "## Targets", _targets(results),
        "## Schedules, flow control, queries", _flow_table(results),
        "## db.sql replicated through the journal", _replica_table(results),
    ]  # fmt: skip
    table = "\n\n".join(sections)
    print(table)
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y-%m-%d")
    header = f"# Benchmark results ({stamp}, {platform.machine()}, {platform.python_version()})\n\n"
    (RESULTS / "latest.md").write_text(header + table + "\n")
    (RESULTS / "latest.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    asyncio.run(main())
