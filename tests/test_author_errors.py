"""Errors an author can act on: a step that was never awaited, and (docs/README, Authoring)
where an error happened."""

from __future__ import annotations

import pytest

from qjsflow.runner import Runner
from tests.conftest import start_source


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ('step.do("forgotten", async () => 1); return 2;', 'step.do("forgotten")'),
        ('step.sleep("nap", 1000); return 2;', 'step.sleep("nap")'),
        ('step.tool("t", "echo", {}); return 2;', 'step.tool("t")'),
        ('step.waitForEvent("w", { type: "go" }); return 2;', 'step.waitForEvent("w")'),
    ],
)
async def test_a_step_never_awaited_fails_the_run_naming_it(
    runner: Runner, body: str, named: str
) -> None:
    run = await start_source(runner, f"export default async (event, step) => {{ {body} }};")
    assert run.status == "failed"
    assert run.error == (
        f"{named} was never awaited: the workflow finished while it was still pending "
        "(await every step call, or Promise.all them)"
    )


@pytest.mark.parametrize(
    "body",
    [
        'await Promise.all([step.do("a", async () => 1), step.do("b", async () => 2)]); return 3;',
        'const early = step.do("a", async () => 1); await step.do("b", async () => 2); '
        "return 3 + 0 * (await early);",
    ],
)
async def test_steps_awaited_together_or_later_are_fine(runner: Runner, body: str) -> None:
    run = await start_source(runner, f"export default async (event, step) => {{ {body} }};")
    assert (run.status, run.output) == ("completed", 3)
