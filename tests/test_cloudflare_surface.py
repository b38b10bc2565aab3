"""Cloudflare Workflows code as its authors write it: the modules `cloudflare:workers` and
`cloudflare:workflows`, several workflow classes in one file, and a Worker beside them."""

from __future__ import annotations

import pytest

from qjsflow.bundles import SourceTreeError
from qjsflow.runner import Runner, StartRunInput

WORKER_FILE = """
import { WorkflowEntrypoint, WorkerEntrypoint, DurableObject } from "cloudflare:workers";
import { NonRetryableError } from "cloudflare:workflows";

type Env = { GREETING?: string };

export class Counter extends DurableObject<Env> {}

export class Signup extends WorkflowEntrypoint<Env, { email: string }> {
  async run(event: { payload: { email: string } }, step: any) {
    const user = await step.do("create user", async () => ({ email: event.payload.email }));
    return { created: user.email };
  }
}

export class Refund extends WorkflowEntrypoint<Env, { amount: number }> {
  async run(event: { payload: { amount: number } }, step: any) {
    return await step.do("check amount", { retries: { limit: 5, delay: 0 } }, async () => {
      if (event.payload.amount > 100) throw new NonRetryableError("refunds over 100 need a human");
      return { refunded: event.payload.amount };
    });
  }
}

// The Worker that would trigger the workflows on Cloudflare: inert here, and not a workflow.
export default class extends WorkerEntrypoint<Env> {
  async fetch() {
    return "ok";
  }
}
"""


async def test_a_file_of_several_workflow_classes_and_a_worker(runner: Runner) -> None:
    published = await runner.publish("acme", {"workflows/billing.ts": WORKER_FILE})
    assert sorted((w.workflow, w.entry_path, w.export) for w in published.workflows) == [
        ("Refund", "workflows/billing.ts", "Refund"),
        ("Signup", "workflows/billing.ts", "Signup"),
    ]
    snapshot = published.snapshot_id
    signup = await runner.start(StartRunInput("acme", "Signup", snapshot, {"email": "a@b.c"}))
    assert (signup.status, signup.output) == ("completed", {"created": "a@b.c"})
    small = await runner.start(StartRunInput("acme", "Refund", snapshot, {"amount": 5}))
    assert small.output == {"refunded": 5}
    large = await runner.start(StartRunInput("acme", "Refund", snapshot, {"amount": 500}))
    assert large.status == "failed"
    assert large.error == "NonRetryableError: refunds over 100 need a human"
    [step] = await runner.list_steps(large.run_id, scope="acme")
    assert step.attempt == 1  # not retried


async def test_a_default_function_keeps_the_file_stem(runner: Runner) -> None:
    source = "export default async () => 1;\nexport const helper = () => 2;\n"
    published = await runner.publish("acme", {"workflows/daily-report.ts": source})
    assert [(w.workflow, w.export) for w in published.workflows] == [("daily-report", "default")]


@pytest.mark.parametrize(
    "source",
    [
        "export const helper = () => 2;\n",
        'import { WorkerEntrypoint } from "cloudflare:workers";\n'
        "export default class extends WorkerEntrypoint { fetch() { return 1; } }\n",
        "export default { fetch() { return 1; } };\n",
        "export class Plain { go() {} }\n",
    ],
)
async def test_a_file_with_no_workflow_is_refused_at_publish(runner: Runner, source: str) -> None:
    with pytest.raises(SourceTreeError, match=r"workflows/w\.ts: exports no workflow"):
        await runner.publish("acme", {"workflows/w.ts": source})
