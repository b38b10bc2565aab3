// Booting a run, loading its bundle, starting its entry, replaying in journal order.

// ---- the body -----------------------------------------------------------------------------

const WORKFLOW_MARK = RealSymbol.for("qjsflow.workflow");
const isClass = (value) => typeof value === "function" && call(strSlice, call(fnToString, value), 0, 5) === "class";
const hasRun = (value) => value.prototype !== undefined && value.prototype !== null &&
  typeof value.prototype.run === "function";
function isWorkflowClass(value) {
  for (let at = value; typeof at === "function"; at = getPrototypeOf(at)) {
    if (hasOwn(at, WORKFLOW_MARK)) return true;
  }
  return false;
}
function moduleOf(namespace) {
  if (namespace === null || typeof namespace !== "object") {
    throw new DriveError("the bundle defines no module");
  }
  return namespace;
}
// What each export is, for publishing to name the workflows of a file.
function describeExports(namespace) {
  const names = objectKeys(moduleOf(namespace));
  const found = [];
  for (let i = 0; i < names.length; i++) {
    const value = namespace[names[i]];
    let kind = "other";
    if (typeof value === "function") {
      if (!isClass(value)) kind = "function";
      else if (isWorkflowClass(value)) kind = "workflow-class";
      else kind = hasRun(value) ? "run-class" : "class";
    }
    const className = typeof value === "function" && typeof value.name === "string" ? value.name : "";
    append(found, { export: names[i], kind, className });
  }
  return found;
}
function findEntry(namespace, exportName) {
  let entry = moduleOf(namespace)[exportName];
  if (exportName === "default" && typeof entry !== "function") {
    // Published before exports were named: the one class with run(), as it was found then.
    const names = objectKeys(namespace);
    for (let i = 0; i < names.length; i++) {
      const value = namespace[names[i]];
      if (typeof value === "function" && hasRun(value)) entry = value;
    }
  }
  if (typeof entry !== "function") {
    throw new DriveError(`the bundle has no workflow export "${exportName}"`);
  }
  return entry;
}

// Run-independent: done ahead of the drive, while the executor would otherwise be idle.
const db = freeze({ sql: dbSql });
const step = freeze({
  do: stepDo, sleep: stepSleep, sleepUntil: stepSleepUntil, waitForEvent: stepWaitForEvent,
  tool: stepTool, notify: stepNotify,
});
let prepared = false;
// The answer holds the routes the lockdown took when it had to walk (see harden): the first
// context's, which the executor compiles into the prelude for the next contexts.
function prepare() {
  // What the bundled "qjsflow" module reaches: db, and the run's env once boot has made it.
  const module = freeze({ db, get env() { return moduleBody === null ? undefined : moduleBody.env; } });
  const routes = lockdown(module);
  prepared = true;
  return routes === null ? "{}" : asciiJSON({ plan: routes });
}

function boot(request) {
  if (!prepared) prepare();
  limits = request.limits;
  runId = request.runId;
  entryExport = request.export;
  inspecting = request.inspect === true;
  strict = request.strict === true;
  rollBackAsked = typeof request.rollBack === "string" ? request.rollBack : null;
  ROOT_SCOPE.clock = request.createdAtMs;
  for (let i = 0; i < request.journal.length; i++) {
    const entry = request.journal[i];
    journal.set(entry.key, {
      value: entry.value, error: entry.error, at: entry.at, seq: i, digest: entry.digest, requested: false,
    });
  }
  for (let i = 0; i < request.unsettled.length; i++) unsettled.add(request.unsettled[i]);
  for (let i = 0; i < request.waiting.length; i++) stillWaiting.set(request.waiting[i][0], request.waiting[i][1]);
  logsSeen = request.logsSeen;
  reach(request.createdAtMs, "start");
  const env = guardedEnv(decode(request.env));
  const event = freeze({
    payload: decode(request.input),
    timestamp: new RealDate(request.createdAtMs),
    instanceId: request.runId,
    workflowName: request.workflow,
  });
  moduleBody = { step, env, event };
}

// The run's env: the bindings the host declared (vars, secret handles) and db, frozen. A name
// that is not set reads `undefined`, as on Cloudflare (code tests `env.X ?? fallback`).
function guardedEnv(declared) {
  defineProperty(declared, "db", { value: db, enumerable: true });
  return freeze(declared);
}
const CTX = freeze({ waitUntil() {} }); // this.ctx of a WorkflowEntrypoint: nothing to wait for

function load(code) {
  if (code === "") {
    // The executor loaded the bundle's bytecode, which defined a function whose body is the
    // bundle (sandbox/bytecode.py, BundleCode): run it, as the global code would run.
    const body = G.__qjsflowBundle;
    delete G.__qjsflowBundle;
    G.__qjsflow_module = call(body, G);
    return;
  }
  // A bundle the executor defined ahead (the one it drove last, sandbox/executor.py
  // Prepared) is not this one: it goes before any of this one's code runs.
  delete G.__qjsflowBundle;
  // Indirect (not called by the name `eval`): global scope, none of ours. Its first line is
  // numbered RULES.bundle_first_line in stack frames. The padding is made here, only for a
  // bundle read as source: 10,000 newlines built as every context was prepared cost a drive
  // ~2 % of its executor's work.
  EVAL(call(strRepeat, "\n", RULES.bundle_first_line - 1) + code);
}

const warnLine = logger("warn");

// The first step call still pending, as the author wrote it; null when none is.
function openCallText() {
  const open = []; // forEach on the frozen Set.prototype, not an iterator authors can reach
  openCalls.forEach((pending) => append(open, pending));
  if (open.length === 0) return null;
  const first = open[0];
  if (first.kind === "sql") return "a db.sql call";
  if (first.kind === "notify") return "a step.notify call";
  return `step.${first.kind}("${first.name}")`;
}

function start() {
  if (inspecting) {
    outcome = { status: "completed", output: encode(describeExports(G.__qjsflow_module), "exports") };
    return;
  }
  const entry = findEntry(G.__qjsflow_module, entryExport);
  const { step, env, event } = moduleBody;
  let body;
  try {
    if (isClass(entry)) {
      const instance = new entry(CTX, env);
      body = instance.run(event, step);
    } else {
      body = entry(event, step, env);
    }
  } catch (thrown) {
    body = P.reject(thrown);
  }
  call(promiseThen, P.resolve(body), (value) => {
    if (rollBackAsked !== null) { // terminated with its rollbacks: they run whatever the body did
      rollBackThenFail(new TerminatedError(rollBackAsked), failWith);
      return;
    }
    // A step call never awaited: Cloudflare leaves what happens to it undefined and completes
    // the run, so the run completes here too, with a warning in its console lines; the call's
    // result is not recorded (README, Coming from Cloudflare Workflows).
    const forgotten = openCallText();
    if (forgotten !== null) {
      const was = currentScope;
      currentScope = ROOT_SCOPE;
      warnLine(`${forgotten} was never awaited: the workflow finished while it was still ` +
        "pending, and its result is not recorded (await every step call, or Promise.all them)");
      currentScope = was;
    }
    try {
      const output = encode(value, "the workflow's result");
      if (outcome === null) outcome = { status: "completed", output };
    } catch (error) {
      fail(error instanceof LimitError ? error.message : describe(error).message, false);
    }
  }, (thrown) => rollBackThenFail(thrown, failWith));
}

// The run fails as its body did (after its rollbacks; `rollbackFailed`: one of them failed
// for good, which the run's error says too).
function failWith(thrown, rollbackFailed) {
  const limit = limitMessage(thrown);
  const { name, message, stack } = describe(thrown);
  let text = limit !== null ? limit : `${name}: ${message}`;
  const failedToo = rollbackFailed === undefined ? undefined : describe(rollbackFailed).message;
  if (failedToo !== undefined) text += ` (and a rollback failed: ${failedToo})`;
  fail(text, false, stack, failedToo);
}

// The waiting replayed entries as a binary min-heap on journal order: a fan-out of n steps
// settles in O(n log n), not O(n^2).
function pushHit(hit) {
  let i = hits.length;
  append(hits, hit);
  while (i > 0) {
    const parent = (i - 1) >> 1;
    if (hits[parent].entry.seq <= hit.entry.seq) break;
    hits[i] = hits[parent];
    i = parent;
  }
  hits[i] = hit;
}
function popHit() {
  const top = hits[0];
  const last = hits[hits.length - 1];
  hits.length -= 1;
  const n = hits.length;
  if (n > 0) {
    let i = 0;
    for (;;) {
      const left = 2 * i + 1;
      if (left >= n) break;
      const right = left + 1;
      const child = right < n && hits[right].entry.seq < hits[left].entry.seq ? right : left;
      if (hits[child].entry.seq >= last.entry.seq) break;
      hits[i] = hits[child];
      i = child;
    }
    hits[i] = last;
  }
  return top;
}

// The executor's turn, in one call (each call from the executor costs as much as a step's
// own work): the drive's end (an object: `ended`) once the body has an outcome, or once
// nothing is left to send and no timer is set; "1" when a replayed step was settled (its
// jobs run next); else what `take` returns: "+", the ops (a list), or "" (a timer is set:
// the executor sleeps until it is due).
function nextTurn() {
  if (outcome !== null) return ended(outcome, true);
  if (nextHit()) return "1";
  const ops = take();
  if (ops !== "" || earliestTimer() >= 0) return ops;
  return ended(finish(), false);
}
// The drive's end, for the executor's last frame: its outcome, and `withOps`, the last ops
// (pure steps' results and console lines, none awaiting an answer), if there are any.
function ended(last, withOps) {
  const text = `{"outcome":${asciiJSON(withReplayed(last))}`;
  const ops = withOps ? takeLast() : "";
  return ops === "" ? text + "}" : `${text},"ops":${ops}}`;
}
// The body's outcome, as the executor reads it ("" while there is none).
function outcomeText() {
  return outcome === null ? "" : asciiJSON(withReplayed(outcome));
}
// Settle the replayed entry that comes first in the journal, if one is waiting.
function nextHit() {
  if (hits.length === 0) return false;
  const hit = popHit();
  settleHit(hit);
  return true;
}

function answer(message) {
  const id = message.id;
  const waiting = typeof id === "number" && id >= 1 && id < pending.length ? pending[id] : undefined;
  if (waiting === undefined) throw new DriveError("the host answered an unknown op " + id);
  pending[id] = undefined;
  currentScope = waiting.scope;
  waiting.onResult(message.result, message.at, waiting.subject);
}

// How many journal entries the drive answered from the journal: a fork onto new code checks
// that the code reached every step it copied.
function withReplayed(ended) {
  const checked = strictEnding(ended);
  checked.replayed = consumed;
  return checked;
}

function finish() {
  if (outcome !== null) return outcome;
  if (markers.length > 0) return { status: "suspended", markers };
  return {
    status: "failed", retryable: false,
    message: "the workflow awaited something that can never resolve (a promise no step settles)",
  };
}
