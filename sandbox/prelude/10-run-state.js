// The run being driven, and determinism: the logical clock and the seeded random.

// ---- run state, set by boot ---------------------------------------------------------------

let limits = null;
let runId = "";
let entryExport = "default";
let inspecting = false;
let strict = false; // a migration's check: every journal entry must be reached
let journal = new RealMap(); // key -> {value, error, at, seq}
const unsettled = new RealSet(); // keys of steps with a row that is not settled
const stillWaiting = new RealMap(); // key -> event type: recorded waits with nothing to take
const openCalls = new RealSet(); // step and db.sql calls whose promise has not settled
// A step.do's promise -> its call, until a callback is attached to the promise (an await,
// Promise.all): only then may the sandbox settle the step as its result is recorded.
const unawaited = new RealWeakMap();
let unawaitedCount = 0; // its entries: replays begin no step, and skip looking in it
let consumed = 0;
let outbox = [];
// id -> {onResult, scope} of the op sent with that id, while its answer is awaited. Ids count
// up from 1 as ops are sent, so this stays a dense array (a QuickJS Map of thousands of
// integer keys is several times slower to look up).
const pending = /** @type {Array<{onResult: Function, scope: any, subject: any} | undefined>} */ ([undefined]);
const hits = []; // replayed entries whose promise waits for its turn: a min-heap on seq
let nextId = 1;
let opsSent = 0;
let notifies = 0;
let logBytes = 0;
let logCount = 0;
let logsSeen = 0;
const markers = [];
let outcome = null;
let moduleBody = null;

// ---- determinism: logical clock and seeded random -----------------------------------------

// Each scope (the workflow body, and every attempt of a step body) has its own clock and its
// own random stream, so that a replay, which skips settled bodies, sees in every other scope
// exactly what the first execution saw (see currentScope in 40-outbox.js).
function seed(text) {
  // cyrb128: four 32-bit hashes of the text seed sfc32.
  let h1 = 1779033703, h2 = 3144134277, h3 = 1013904242, h4 = 2773480762;
  for (let i = 0; i < text.length; i++) {
    const k = call(strCharCodeAt, text, i);
    h1 = h2 ^ imul(h1 ^ k, 597399067);
    h2 = h3 ^ imul(h2 ^ k, 2869860233);
    h3 = h4 ^ imul(h3 ^ k, 951274213);
    h4 = h1 ^ imul(h4 ^ k, 2716044179);
  }
  h1 = imul(h3 ^ (h1 >>> 18), 597399067);
  h2 = imul(h4 ^ (h2 >>> 22), 2869860233);
  h3 = imul(h1 ^ (h3 >>> 17), 951274213);
  h4 = imul(h2 ^ (h4 >>> 19), 2716044179);
  return [(h1 ^ h2 ^ h3 ^ h4) >>> 0, (h2 ^ h1) >>> 0, (h3 ^ h1) >>> 0, (h4 ^ h1) >>> 0];
}
// A scope's stream is seeded from a text, made and hashed at its first draw (`rng` is null
// until then): most steps never draw, and making the text (the clock's digits among it) at
// every step they reach cost them all. The text is the run, the key of the step last reached
// (or of the attempt, with its number) and the scope's clock, which moves only in `reach`.
function seedText(scope) {
  const attempt = scope.seedAttempt > 0 ? "\u0000" + scope.seedAttempt : "";
  return runId + "\u0000" + scope.seedKey + attempt + "\u0000" + scope.clock;
}
// Math.random: a method, as the engine's is (no `prototype`, not a constructor).
const { random } = {
  random() {
    const scope = currentScope;
    if (scope.rng === null) scope.rng = seed(seedText(scope));
    let [a, b, c, d] = scope.rng;
    const t = (((a + b) >>> 0) + d) >>> 0;
    d = (d + 1) >>> 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) >>> 0;
    c = (c << 21) | (c >>> 11);
    c = (c + t) >>> 0;
    scope.rng = [a >>> 0, b, c, d];
    return t / 4294967296;
  },
};
// A scope's clock only moves forward, to the time of each journal event it reaches.
function reach(at, key) {
  const scope = currentScope;
  if (typeof at === "number" && at > scope.clock) scope.clock = at;
  scope.rng = null;
  scope.seedKey = key;
  scope.seedAttempt = 0;
}

function LogicalDate(...args) {
  const now = currentScope.clock;
  if (new.target === undefined) return call(RealDate.prototype.toString, new RealDate(now));
  return construct(RealDate, args.length === 0 ? [now] : args, new.target);
}
defineProperty(LogicalDate, "prototype", { value: RealDate.prototype });
LogicalDate.now = () => currentScope.clock;
LogicalDate.parse = RealDate.parse;
LogicalDate.UTC = RealDate.UTC;
defineProperty(RealDate.prototype, "constructor", { value: LogicalDate });
