"""The lockdown's plan: a context prepared by following the routes the first context's walk
found has every intrinsic frozen that the walk would have frozen (sandbox/prelude/
60-lockdown.js, harden), and a plan that does not fit falls back to the walk."""

from __future__ import annotations

import orjson
import quickjs

from qjsflow.sandbox.bytecode import PreludeLoader
from qjsflow.sandbox.executor import PRELUDE, Prepared

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


def test_a_context_prepared_by_the_plan_is_locked_down_as_by_the_walk() -> None:
    loader = PreludeLoader(PRELUDE)
    walked = Prepared(loader)
    routes = orjson.loads(walked.plan)
    assert len(routes) > 100
    followed = Prepared(loader, walked.plan)
    assert followed.plan == walked.plan
    reached, unfrozen = _unfrozen(walked)
    assert reached > 100
    assert unfrozen == 0
    assert _unfrozen(followed) == [reached, 0]


def test_the_next_context_follows_the_plan_instead_of_walking() -> None:
    loader = PreludeLoader(PRELUDE)
    plan = Prepared(loader).plan
    context = quickjs.Context()
    dispatch = loader.evaluate(context)
    assert dispatch("prepare", plan) == "{}"  # followed: no new plan


def test_a_plan_that_does_not_fit_falls_back_to_the_walk() -> None:
    loader = PreludeLoader(PRELUDE)
    reached = _unfrozen(Prepared(loader))[0]
    for wrong in ([[0, 100000]], [[0, 0], [2, 0, "no such property"]], [[1, 5]]):
        prepared = Prepared(loader, orjson.dumps(wrong).decode())
        assert prepared.plan != orjson.dumps(wrong).decode()  # its own, from the walk
        assert _unfrozen(prepared) == [reached, 0]
