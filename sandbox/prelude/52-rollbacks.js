// Rollback handlers (Cloudflare, June 2026): `step.do(name, [config], fn, { rollback,
// rollbackConfig })`. Each step.do call with a rollback is registered as it is made, in call
// order, on every drive alike (the body runs again from the top). When the run is about to
// fail — its body rejected, not an error the author's code caught — the registered rollbacks
// run in reverse start order before the run fails, each a durable step of its own (named
// `rollback NAME`, with the rollback config's retries and timeout), given { ctx, output,
// error }: so a crash mid-rollback replays, and each compensation that completed answers from
// the journal instead of running again.
const rollbacks = [];
let rollingBack = false; // the body failed: the rollbacks run; a second failure does not wait
// `terminate --rollback`: the operator's message. The body replays what the journal holds;
// its first call past that fails with a TerminatedError, and the rollbacks run (they alone
// may make new calls).
let rollBackAsked = null;
class TerminatedError extends RealError {
  constructor(message) {
    super(message);
    this.name = "TerminatedError";
  }
}
// Whether a new call (one the journal does not answer) is refused: the run is being
// terminated with its rollbacks, and this is not one of them.
function refusedForRollBack() {
  return rollBackAsked !== null && !rollingBack;
}

function registerRollback(name, config, options, promise) {
  if (options === undefined || options === null) return;
  if (typeof options !== "object") throw new RealTypeError(`step.do("${name}") options must be an object`);
  const given = readOptions(options, { rollback: 1, rollbackConfig: 1 }, `step.do("${name}") options`);
  if (given.rollback === undefined) return;
  if (typeof given.rollback !== "function") {
    throw new RealTypeError(`step.do("${name}") rollback must be a function`);
  }
  const counters = currentScope.counters;
  const entry = {
    name, count: counters ? counters.get("do:" + name) : 1, config, rollback: given.rollback,
    checked: stepConfig(given.rollbackConfig, "step.do rollback", name), output: undefined,
    error: undefined,
  };
  append(rollbacks, entry);
  call(promiseThen, promise, (value) => { entry.output = value; }, (thrown) => { entry.error = thrown; });
}

// The body rejected with `thrown`: run the rollbacks, newest first, then fail as the body did.
function rollBackThenFail(thrown, failWith) {
  if (rollbacks.length === 0 || rollingBack) {
    failWith(thrown);
    return;
  }
  rollingBack = true;
  let chain = P.resolve();
  for (let i = rollbacks.length - 1; i >= 0; i--) {
    const entry = rollbacks[i];
    chain = call(promiseThen, chain, () => runRollback(entry));
  }
  call(promiseThen, chain, () => failWith(thrown), (failed) => failWith(thrown, failed));
}

function runRollback(entry) {
  const handler = entry.rollback;
  const body = (attempt) => handler({
    ctx: freeze({ step: freeze({ name: entry.name, count: entry.count }), attempt: attempt.attempt, config: entry.checked[0] }),
    output: entry.output,
    error: entry.error,
  });
  const name = `rollback ${entry.name}`;
  const spec = { name, fn: body, config: entry.checked[0], policy: policyOnWire(entry.checked) };
  const op = { op: "step.check", step: name, kind: "do", config: spec.policy };
  return request("do", name, op, checkAnswered, beginStep, spec);
}
