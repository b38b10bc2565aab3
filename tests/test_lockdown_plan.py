"""The lockdown's plan: a context of the prelude compiled with the routes the first context's
walk found (sandbox/lockdown_plan.py) has every intrinsic frozen that the walk would have frozen
(sandbox/prelude/60-lockdown.js, harden), and a plan that does not fit falls back to the
walk."""

from __future__ import annotations

import orjson
import quickjs

from qjsflow.sandbox.bytecode import PreludeLoader
from qjsflow.sandbox.executor import PRELUDE, Prepared, load_prelude, planned_prelude
from qjsflow.sandbox.lockdown_plan import plan_part

# The walk of the lockdown, written again independently of it: every object reachable from the
# global's values (and the hidden intrinsics the lockdown also names), through prototypes and
# property values (plain methods aside), must be frozen. [reached, not frozen].
UNFROZEN = """
(() => {
  const roots = [];
  for (const key of Reflect.ownKeys(globalThis)) {
    const desc = Object.getOwnPropertyDescriptor(globalThis, key);
    if ("value" in desc) roots.push(desc.value);
  }
  // Fresh instances of the hidden intrinsics: what they inherit from (they are new objects).
  const functions = [async function () {}, function* () {}, async function* () {}];
  const samples = [...functions, ...functions.map((sample) => sample.prototype)];
  samples.push([][Symbol.iterator](), new Map().entries(), new Set().values(), ""[Symbol.iterator]());
  samples.push(RegExp.prototype[Symbol.matchAll].call(/a/g, "a"));
  for (const sample of samples) if (sample !== undefined) roots.push(Object.getPrototypeOf(sample));
  const seen = new Set();
  let unfrozen = 0;
  while (roots.length) {
    const object = roots.pop();
    if (object === null || (typeof object !== "object" && typeof object !== "function")) continue;
    if (seen.has(object) || object === globalThis) continue;
    seen.add(object);
    if (!Object.isFrozen(object)) unfrozen += 1;
    roots.push(Object.getPrototypeOf(object));
    for (const key of Reflect.ownKeys(object)) {
      const value = Object.getOwnPropertyDescriptor(object, key).value;
      if ((value !== null && typeof value === "object") ||
          (typeof value === "function" && Object.hasOwn(value, "prototype"))) roots.push(value);
    }
  }
  return JSON.stringify([seen.size, unfrozen]);
})()
"""


def _unfrozen(prepared: Prepared) -> list[int]:
    reached: list[int] = orjson.loads(prepared.context.eval(UNFROZEN))
    return reached


def _followed(prepared: Prepared) -> bool:
    """Whether the context followed a compiled plan (it answers with routes when it walked)."""
    return prepared.answer == "{}"


def test_a_context_prepared_by_the_plan_is_locked_down_as_by_the_walk() -> None:
    loader = PreludeLoader(PRELUDE)
    walked = Prepared(loader)
    assert not _followed(walked)
    assert len(orjson.loads(walked.answer)["plan"]) > 100
    planned = planned_prelude(loader)
    assert planned is not loader
    assert planned.fast
    followed = Prepared(planned)
    assert _followed(followed)
    reached, unfrozen = _unfrozen(walked)
    assert reached > 100
    assert unfrozen == 0
    assert _unfrozen(followed) == [reached, 0]


def test_every_context_of_the_planned_prelude_follows_the_plan() -> None:
    planned = planned_prelude(PreludeLoader(PRELUDE))
    for _ in range(3):
        context = quickjs.Context()
        assert planned.evaluate(context)("prepare", "") == "{}"


def test_a_plan_that_does_not_fit_falls_back_to_the_walk() -> None:
    loader = PreludeLoader(PRELUDE)
    reached = _unfrozen(Prepared(loader))[0]
    chain = [[0, 0]] + [[1, n] for n in range(8)]  # a prototype chain ends in null before
    for wrong in ([[0, 100000]], [[0, 0], [2, 0, "no such property"]], chain):
        part = plan_part(orjson.dumps({"plan": wrong}).decode())
        assert part is not None
        prepared = Prepared(PreludeLoader(load_prelude(part)))
        assert not _followed(prepared)  # it walked, and answers with its own routes
        assert _unfrozen(prepared) == [reached, 0]


def test_routes_that_are_not_routes_compile_no_plan() -> None:
    for answer in ("{}", '{"plan": []}', '{"plan": [[3]]}', '{"plan": [[1, 0]]}',
                   '{"plan": [[0, 1], [2, 0, 5]]}', '{"plan": [[0, -1]]}', '{"plan": [[0, true]]}',
                   '{"plan": [[0, 1], [2, 0, "x", 2]]}', "not json"):  # fmt: skip
        assert plan_part(answer) is None, answer


def test_a_key_is_only_ever_a_key() -> None:
    # Written into the text as it is, this key would run its assignment as the route is taken.
    key = 'x"] || (globalThis.injected = 1), o0["x'
    part = plan_part(orjson.dumps({"plan": [[0, 0], [2, 0, key]]}).decode())
    assert part is not None
    prepared = Prepared(PreludeLoader(load_prelude(part)))
    assert not _followed(prepared)  # no such property: the walk
    assert prepared.context.eval("typeof globalThis.injected") == "undefined"
