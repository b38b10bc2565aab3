// The outbox, step identity (occurrences, scopes) and settling answers.

// ---- the outbox ---------------------------------------------------------------------------

function fail(message, retryable, stack) {
  if (outcome === null) {
    /** @type {{status: string, retryable: boolean, message: string, stack?: string}} */
    const failed = { status: "failed", retryable: !!retryable, message: errorText(message, RULES.error_message_chars) };
    if (stack) failed.stack = stack;
    outcome = failed;
  }
}
function send(op, onResult) {
  opsSent += 1;
  if (opsSent > limits.ops_per_drive) {
    fail(`ops per drive limit of ${limits.ops_per_drive} exceeded`, false);
    throw new LimitError("ops per drive limit exceeded");
  }
  const id = nextId++;
  append(outbox, { id, op });
  if (onResult !== null) pending.set(id, { onResult, scope: currentScope });
}

// Step identity. Calls made inside a step body are scoped by that step: their names carry
// the parent's key ("do:1:sync/push"), so a replay that skips a settled body does not shift
// the occurrence counts of calls made by bodies that do run. The scope of running code is
// the scope of the promise whose settling resumed it (the executor settles one at a time).
// Names are escaped ("/" and "%" as %2F and %25) before they are joined, so a name holding
// "/" or ":" can never spell another step's key.
const ROOT_SCOPE = {
  id: "", prefix: "", counters: new RealMap(), depth: 0, clock: 0, rng: [1, 2, 3, 4], logs: 0,
};
let currentScope = ROOT_SCOPE;
const MAX_NESTING = 8;
let stepsTaken = 0; // every step call of this execution, replayed or new
function occurrence(kind, name) {
  const counter = kind + ":" + name;
  const count = (currentScope.counters.get(counter) || 0) + 1;
  stepsTaken += 1;
  if (stepsTaken > limits.steps_per_run) {
    throw new LimitError(`steps per run limit of ${limits.steps_per_run} exceeded`);
  }
  currentScope.counters.set(counter, count);
  return count;
}
// An attempt of a step body: its own names, clock and random stream, seeded from the run,
// the step's key and the attempt, starting at `startedAt` (the attempt's journal time).
function attemptScope(key, attempt, startedAt) {
  if (currentScope.depth >= MAX_NESTING) {
    throw new LimitError(`steps nested deeper than ${MAX_NESTING} levels`);
  }
  const clock = typeof startedAt === "number" && startedAt > currentScope.clock ? startedAt : currentScope.clock;
  return {
    id: key + "#" + attempt, prefix: key + "/", counters: new RealMap(), depth: currentScope.depth + 1,
    clock, logs: 0,
    rng: seed(runId + "\u0000" + key + "\u0000" + attempt + "\u0000" + clock),
  };
}
const NAME_ESCAPES = /[%/]/g;
const escapeNameChar = (c) => (c === "%" ? "%25" : "%2F");
function escapeName(name) {
  return call(strReplace, name, NAME_ESCAPES, escapeNameChar);
}
// A step call: answered from the journal (in journal order) or sent to the host.
function request(kind, name, op, onAnswer, begin) {
  const count = occurrence(kind, name);
  const fullName = currentScope.prefix + escapeName(name);
  const key = kind + ":" + count + ":" + fullName;
  const scope = currentScope;
  const call = { kind, name };
  openCalls.add(call);
  return new P((settleValue, settleError) => {
    const resolve = (value) => {
      openCalls.delete(call);
      settleValue(value);
    };
    const reject = (error) => {
      openCalls.delete(call);
      settleError(error);
    };
    const entry = journal.get(key);
    if (entry !== undefined) {
      pushHit({ entry, key, resolve, reject, scope });
      return;
    }
    if (begin !== undefined && !unsettled.has(key)) {
      begin(key, count, fullName, resolve, reject);
      return;
    }
    op.count = count;
    op.step = fullName;
    send(op, (result, at) => onAnswer(result, at, key, count, resolve, reject, fullName));
  });
}
function settleHit(hit) {
  currentScope = hit.scope;
  consumed += 1;
  reach(hit.entry.at, hit.key);
  if (hit.entry.error) hit.reject(makeError(hit.entry.error));
  else hit.resolve(decode(hit.entry.value));
}
// The default answer handler: a value is a journal value (encoded text, or null).
function valueAnswer(result, at, key, _count, resolve, reject) {
  if (hasOwn(result, "suspend")) {
    append(markers, { suspend: result.suspend, event: result.event });
  } else if (hasOwn(result, "error")) {
    reach(at, key);
    reject(makeError(result.error));
  } else {
    reach(at, key);
    resolve(result.value === null ? undefined : decode(result.value));
  }
}
// A step call that fails before reaching the host rejects; a limit also fails the drive.
function reject(error) {
  if (error instanceof LimitError) fail(error.message, false);
  return P.reject(error);
}
