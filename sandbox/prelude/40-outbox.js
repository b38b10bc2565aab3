// The outbox, step identity (occurrences, scopes) and settling answers.

// ---- the outbox ---------------------------------------------------------------------------

function fail(message, retryable, stack, rollbackFailed) {
  if (outcome === null) {
    /** @type {{status: string, retryable: boolean, message: string, stack?: string, rollbackFailed?: string}} */
    const failed = { status: "failed", retryable: !!retryable, message: errorText(message, RULES.error_message_chars) };
    if (stack) failed.stack = stack;
    if (rollbackFailed !== undefined) failed.rollbackFailed = errorText(rollbackFailed, RULES.error_message_chars);
    outcome = failed;
  }
}
// `onResult(result, at, subject)` is called with the answer (or the sandbox's settling).
function send(op, onResult, subject) {
  opsSent += 1;
  if (opsSent > limits.ops_per_drive) {
    fail(`ops per drive limit of ${limits.ops_per_drive} exceeded`, false);
    throw new LimitError("ops per drive limit exceeded");
  }
  const id = nextId++;
  const message = { id, op };
  append(outbox, message);
  pending[id] = onResult === null ? undefined : { onResult, scope: currentScope, subject };
  return message;
}

// A pure step's result (a step.do begun in this drive whose attempt made no effect: no tool,
// fetch, db.sql or notify) is settled by the sandbox itself, which goes on without waiting for
// the host: the journal could answer it nothing else (the host checks that it agrees, and
// drives the run again from the journal when it does not, servicing nothing sent after). Its
// record carries the run's clock it settled at, which replays reach in its place, so time in
// a run moves only when the host answers (as in a Worker, where it moves only at I/O).
// Ops settled this way wait in `held` and go to the host with the next frame. A step whose
// begin has not gone out yet goes as its record alone, carrying the begin's policy (one op,
// one row written, instead of two).
// Their state is kept on the messages under symbols, which the frame's JSON leaves out (a
// QuickJS Set of thousands of integer ids costs tens of microseconds an operation).
const OPENING = RealSymbol("opening"); // on a record the sandbox may settle: its step.begin
const UNSENT = RealSymbol("unsent"); // on a step.begin: not sent yet
const INSIDE = RealSymbol("inside"); // on a step.begin: goes inside its record
const CALL = RealSymbol("call"); // on a record the sandbox may settle: its step call
let held = [];
let heldChars = 0; // of the results held: past HELD_CHARS they go out, as the memory is the run's
const HELD_CHARS = 262144;
// The ops to send now, or "+" when every op waiting was settled here (nothing to wait for).
// Only when all of them can be, so that nothing that waits for the host comes before a result
// settled here, and the journal's order is the order the run saw.
function take() {
  if (settleable(false)) {
    settleOutbox();
    return "+";
  }
  const taken = takeOutbox();
  for (let i = 0; i < taken.length; i++) append(held, taken[i]);
  return release([]); // sent as they are: the host answers them
}
// How far `settleable` has looked into the outbox: its first `scanned` ops can be settled
// here (their results `scannedChars` long), or one of them awaits the host (`blocked`), which
// nothing in this outbox gets past. Each op is looked at once however often it is asked (as
// each pure result is recorded): a fan-out of n steps stays linear.
let scanned = 0;
let scannedChars = 0;
let blocked = false;
function takeOutbox() {
  const taken = outbox;
  outbox = [];
  scanned = 0;
  scannedChars = 0;
  blocked = false;
  return taken;
}
// Whether every op waiting can be settled here: none awaits the host's answer, the results
// held stay within HELD_CHARS, and some op is waiting. `early`: and every step settled is
// awaited already (one that is not yet may be later: the look stops there, to go on then).
function settleable(early) {
  if (outbox.length === 0 || blocked) return false;
  for (; scanned < outbox.length; scanned++) {
    const message = outbox[scanned];
    if (message[OPENING] === undefined && pending[message.id] !== undefined) {
      blocked = true;
      return false;
    }
    if (early && message[OPENING] !== undefined && !message[CALL].awaited) return false;
    if (typeof message.op.value === "string") scannedChars += message.op.value.length;
  }
  return heldChars + scannedChars <= HELD_CHARS;
}
function settleOutbox() {
  heldChars += scannedChars;
  const taken = takeOutbox();
  for (let i = 0; i < taken.length; i++) {
    append(held, taken[i]);
    if (taken[i][OPENING] !== undefined) settleHere(taken[i]);
  }
}
// A pure result settles as it is recorded, when `take` would settle it at the turn's end
// anyway, no replayed step waits for its turn (those come first in the journal, so they
// settle first), and its call is awaited: its continuation runs in the same drain of jobs
// rather than a turn later, and a turn costs a call from the executor. Replays settle it in
// the same order. A call nobody awaits yet settles at the turn's end, as before: a body that
// ends before then has left it pending, and fails naming it.
function settleEarly() {
  if (hits.length === 0 && settleable(true)) settleOutbox();
}
function settleHere(message) {
  const waiting = pending[message.id];
  pending[message.id] = undefined;
  const opening = message[OPENING];
  if (opening[UNSENT]) {
    opening[INSIDE] = true;
    message.op.config = opening.op.config;
  }
  currentScope = waiting.scope;
  message.op.at = currentScope.clock;
  waiting.onResult({ value: null }, currentScope.clock, waiting.subject);
}
// The held ops and then `more`, as the frame to send ("" for none); begins that went inside
// their record are left out.
function release(more) {
  const sent = [];
  for (let i = 0; i < held.length; i++) {
    const message = held[i];
    message[UNSENT] = false;
    if (message[INSIDE] !== true) append(sent, message);
  }
  for (let i = 0; i < more.length; i++) append(sent, more[i]);
  held = [];
  heldChars = 0;
  return sent.length === 0 ? "" : asciiJSON(sent);
}
// At the end of a drive: what was settled here, and console output. A step call nobody
// awaited must not run after the body has finished.
function takeLast() {
  const logs = [];
  const taken = takeOutbox();
  for (let i = 0; i < taken.length; i++) if (taken[i].op.op === "log") append(logs, taken[i]);
  return release(logs);
}

// Step identity. Calls made inside a step body are scoped by that step: their names carry
// the parent's key ("do:1:sync/push"), so a replay that skips a settled body does not shift
// the occurrence counts of calls made by bodies that do run. The scope of running code is
// the scope of the promise whose settling resumed it (the executor settles one at a time).
// Names are escaped ("/" and "%" as %2F and %25) before they are joined, so a name holding
// "/" or ":" can never spell another step's key.
// An attempt's scope keeps its step's key and attempt; the texts made of them (its id for
// console lines, its prefix for calls inside it) are made when asked for.
const ROOT_SCOPE = {
  key: "", attempt: 0, counters: new RealMap(), depth: 0, clock: 0, logs: 0, parent: null,
  effectful: false, rng: /** @type {number[] | null} */ ([1, 2, 3, 4]), seedKey: "", seedAttempt: 0,
};
const scopeId = (scope) => (scope.parent === null ? "" : scope.key + "#" + scope.attempt);
const scopePrefix = (scope) => (scope.parent === null ? "" : scope.key + "/");
let currentScope = ROOT_SCOPE;
const MAX_NESTING = 8;
let stepsTaken = 0; // every step call of this execution, replayed or new
function occurrence(kind, name) {
  const counter = kind + ":" + name;
  // An attempt's counters are made with its first call (most step bodies make none).
  const counters = currentScope.counters || (currentScope.counters = new RealMap());
  const count = (counters.get(counter) || 0) + 1;
  stepsTaken += 1;
  if (stepsTaken > limits.steps_per_run) {
    throw new LimitError(`steps per run limit of ${limits.steps_per_run} exceeded`);
  }
  counters.set(counter, count);
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
    key, attempt, counters: null, depth: currentScope.depth + 1, clock, logs: 0,
    parent: currentScope, effectful: false, rng: null, seedKey: key, seedAttempt: attempt,
  };
}
const NAME_ESCAPES = /[%/]/g;
const escapeNameChar = (c) => (c === "%" ? "%25" : "%2F");
function escapeName(name) {
  // Most names have neither: two searches cost a fifth of a replace by a global regex.
  if (call(strIndexOf, name, "%") < 0 && call(strIndexOf, name, "/") < 0) return name;
  return call(strReplace, name, NAME_ESCAPES, escapeNameChar);
}
// The digest of a call's arguments (cyrb53: 53 bits, as hex). It is recorded with the call and
// compared on every replay: a replay that asks with other arguments diverges from the run, and
// is never answered from the result recorded for the old ones.
function callDigest(text) {
  let h1 = 0xdeadbeef;
  let h2 = 0x41c6ce57;
  for (let i = 0; i < text.length; i++) {
    const ch = call(strCharCodeAt, text, i);
    h1 = imul(h1 ^ ch, 2654435761);
    h2 = imul(h2 ^ ch, 1597334677);
  }
  h1 = imul(h1 ^ (h1 >>> 16), 2246822507);
  h1 ^= imul(h2 ^ (h2 >>> 13), 3266489909);
  h2 = imul(h2 ^ (h2 >>> 16), 2246822507);
  h2 ^= imul(h1 ^ (h1 >>> 13), 3266489909);
  return call(numToString, 4294967296 * (2097151 & h2) + (h1 >>> 0), 16);
}
function digestOf(op) {
  if (typeof op.args === "string") return callDigest(op.args);
  if (typeof op.sql === "string") return callDigest(op.sql + "\u0000" + op.params);
  return undefined;
}
// A replay that is not the run's: the drive fails naming the step, with the frames of the
// call that diverged (the author's file:line once mapped).
function diverge(message) {
  const where = new RealError(message);
  fail(`divergence: ${message}`, false, where.stack);
  return where;
}
// A migration's check (runner/operations/migrate.py): the calls the journal did not hold, where made;
// and for the run's own steps, the turn of the replay each was reached in (a turn ends when a
// replayed step settles: calls made in one turn are concurrent, a Promise.all).
const newCalls = [];
let replayTurn = 0;
function strictEnding(ended) {
  if (!strict || ended.status === "failed") return ended;
  /** @type {string | undefined} */
  let missed;
  /** @type {{key: string, entry: any} | undefined} */
  let latest;
  /** @type {{key: string, entry: any, after: string} | undefined} */
  let reordered;
  journal.forEach((entry, key) => {
    const name = call(strSlice, key, call(strIndexOf, key, ":", call(strIndexOf, key, ":") + 1) + 1);
    if (call(strIndexOf, name, "/") >= 0 || missed !== undefined || reordered !== undefined) return;
    if (!entry.requested) {
      missed = key;
    } else if (latest !== undefined && entry.turn < latest.entry.turn) {
      reordered = { key, entry, after: latest.key };
    } else if (latest === undefined || entry.turn > latest.entry.turn) {
      latest = { key, entry };
    }
  });
  const failed = { status: "failed", retryable: false, message: "" };
  const early = /** @type {{key: string, entry: any, after: string} | undefined} */ (reordered);
  if (early !== undefined) {
    failed.message = `divergence: the code reaches step ${early.key} before step ` +
      `${early.after}; the run reached them the other way round`;
    failed.stack = early.entry.stack;
    return failed;
  }
  if (missed === undefined) return ended;
  const first = newCalls[0];
  const instead = first === undefined ? "it did not call anything else" : `it called ${first.key} instead`;
  failed.message = `divergence: the code does not reach step ${missed} as the run did: ${instead}`;
  if (first !== undefined) failed.stack = first.stack;
  return failed;
}

// A step call: answered from the journal (in journal order) or sent to the host.
// `onAnswer` and `begin` are told `spec`, what the step API was given.
function request(kind, name, op, onAnswer, begin, spec) {
  const count = occurrence(kind, name);
  const fullName = scopePrefix(currentScope) + escapeName(name);
  const key = kind + ":" + count + ":" + fullName;
  const scope = currentScope;
  const call = { kind, name, awaited: false };
  const digest = digestOf(op);
  if (digest !== undefined) op.digest = digest;
  openCalls.add(call);
  let begun = false;
  const promise = new P((settleValue, settleError) => {
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
      if (digest !== undefined && entry.digest && entry.digest !== digest) {
        reject(diverge(`step ${key} was called with other arguments than the run recorded`));
        return;
      }
      entry.requested = true;
      if (strict) {
        entry.turn = replayTurn;
        entry.stack = new RealError(key).stack;
      }
      pushHit({ entry, key, resolve, reject, scope });
      return;
    }
    if (refusedForRollBack()) { // terminated with its rollbacks: nothing new but them
      reject(new TerminatedError(rollBackAsked));
      return;
    }
    if (strict) append(newCalls, { key, stack: new RealError(key).stack });
    if (begin !== undefined && !unsettled.has(key)) {
      begun = true;
      begin(spec, key, count, fullName, resolve, reject, call);
      return;
    }
    const waitingFor = stillWaiting.get(key);
    if (waitingFor !== undefined) {
      // A recorded wait the journal would answer only with a suspension (the host looked as
      // the drive began, and looks again as it ends): the run suspends on it, unasked.
      append(markers, { suspend: "event", event: waitingFor });
      return;
    }
    op.count = count;
    op.step = fullName;
    if (kind !== "do") {
      // An effect: no step enclosing it is pure in this drive (see OPENING).
      for (let s = scope; s !== null; s = s.parent) s.effectful = true;
    }
    send(op, (result, at) => onAnswer(result, at, key, count, resolve, reject, fullName, spec));
  });
  if (begun) {
    unawaited.set(promise, call);
    unawaitedCount += 1;
  }
  return promise;
}
function settleHit(hit) {
  currentScope = hit.scope;
  consumed += 1;
  replayTurn += 1;
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
