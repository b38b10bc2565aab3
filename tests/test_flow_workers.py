"""Flow control across real worker processes, on both journals: a key's concurrency holds
whichever worker admits and drives its runs, measured from the journal's own order of events,
and another key is not held back by it."""

from __future__ import annotations

import orjson

from qjsflow.runner import Runner, StartRunInput
from tests.worker_pool import Workers

WORK = """export default async (event, step) => {
  await step.sleep("work", "1 second");
  return event.payload;
};"""


async def test_concurrency_two_per_key_across_two_workers(workers: Workers, api: Runner) -> None:
    manifest = {"workflows": {"job": {"flow_control": {
        "concurrency": {"limit": 2, "key": "event.payload.customer"}}}}}  # fmt: skip
    await api.publish("acme", {"workflows/job.ts": WORK, "qjsflow.json": orjson.dumps(manifest)})
    spawned = [workers.spawn(), workers.spawn()]
    for process in spawned:
        await workers.serving(process)
    runs = {}
    for n in range(10):
        for customer in ("a", "b"):
            request = StartRunInput("acme", "job", "latest", {"customer": customer, "n": n})
            runs[(await api.start(request, drive=False)).run_id] = customer
    for run_id in runs:
        assert (await api.wait(run_id, scope="acme", timeout_s=120)).status == "completed"
    # The journal's order: +1 as a run leaves its queue, -1 as it ends.
    moves = []
    for run_id, customer in runs.items():
        for event in await api.history(run_id, scope="acme"):
            if event.type in ("run_admitted", "run_completed"):
                moves.append((event.seq, customer, 1 if event.type == "run_admitted" else -1))
    running = {"a": 0, "b": 0}
    most = {"a": 0, "b": 0}
    both_full = False
    for _, customer, move in sorted(moves):
        running[customer] += move
        most[customer] = max(most[customer], running[customer])
        both_full = both_full or running == {"a": 2, "b": 2}
    assert most == {"a": 2, "b": 2}  # never more than two of a key, and two used
    assert both_full  # one key's queue did not hold the other's runs back
    assert len([m for m in moves if m[2] == 1]) == 20  # each admitted once
