// The qjsflow prelude: evaluated first in every fresh QuickJS context, before any author code.
//
// It evaluates to one function, `dispatch(command, argument)`, which the executor keeps and which
// is never reachable from globalThis. JS never calls into Python: step calls append messages to
// an outbox that the executor drains; the executor settles them one answer at a time and runs
// pending jobs in between. Every string returned to Python is ASCII JSON.
//
// Boot order matters: capture intrinsics, install determinism (Date, Math.random, removed
// globals), define the runtime, then harden (freeze) every intrinsic. Only then does author
// code run.
(function () {
  "use strict";
  const G = globalThis;
  const O = Object;
  const R = Reflect;
  const J = JSON;
  const P = Promise;
  const RealDate = Date;
  const RealError = Error;
  const RealTypeError = TypeError;
  const RealMap = Map;
  const RealSet = Set;
  const RealBigInt = BigInt;
  const RealUint8Array = Uint8Array;
  const RealArrayBuffer = ArrayBuffer;
  const RealRegExp = RegExp;
  const apply = R.apply;
  const construct = R.construct;
  const defineProperty = O.defineProperty;
  const getOwnPropertyDescriptor = O.getOwnPropertyDescriptor;
  const getPrototypeOf = O.getPrototypeOf;
  const ownKeys = R.ownKeys;
  const objectKeys = O.keys;
  const freeze = O.freeze;
  const isFrozen = O.isFrozen;
  const hasOwn = O.hasOwn;
  const createObject = O.create;
  const isArray = Array.isArray;
  const stringify = J.stringify;
  const parseJSON = J.parse;
  const isView = RealArrayBuffer.isView;
  const imul = Math.imul;
  const strReplace = String.prototype.replace;
  const strSlice = String.prototype.slice;
  const strCharCodeAt = String.prototype.charCodeAt;
  const strTest = RealRegExp.prototype.test;
  const isWellFormed = String.prototype.isWellFormed;
  const toWellFormed = String.prototype.toWellFormed;
  const numToString = Number.prototype.toString;
  const bigToString = RealBigInt.prototype.toString;
  const dateGetTime = RealDate.prototype.getTime;
  const getter = (proto, name) => getOwnPropertyDescriptor(proto, name).get;
  const mapSize = getter(RealMap.prototype, "size");
  const setSize = getter(RealSet.prototype, "size");
  const mapEntries = RealMap.prototype.entries;
  const setValues = RealSet.prototype.values;
  const mapSet = RealMap.prototype.set;
  const setAdd = RealSet.prototype.add;
  const TypedArray = getPrototypeOf(RealUint8Array);
  const typedArrayTag = getter(TypedArray.prototype, Symbol.toStringTag);
  const typedArrayBuffer = getter(TypedArray.prototype, "buffer");
  const typedArrayOffset = getter(TypedArray.prototype, "byteOffset");
  const typedArrayByteLength = getter(TypedArray.prototype, "byteLength");
  const arrayBufferByteLength = getter(RealArrayBuffer.prototype, "byteLength");
  const regexpSource = getter(RealRegExp.prototype, "source");
  const regexpFlags = getter(RealRegExp.prototype, "flags");
  const promiseThen = P.prototype.then;
  const iteratorNext = (iterator) => iterator.next();
  const TYPED = {};
  for (const name of [
    "Int8Array", "Uint8Array", "Uint8ClampedArray", "Int16Array", "Uint16Array", "Int32Array",
    "Uint32Array", "Float16Array", "Float32Array", "Float64Array", "BigInt64Array", "BigUint64Array",
  ]) {
    if (typeof G[name] === "function") TYPED[name] = G[name];
  }
  const EVAL = G.eval;

  // ---- small helpers that never touch author-modifiable state -------------------------------

  const call = (fn, self, ...args) => apply(fn, self, args);
  const append = (list, item) => {
    list[list.length] = item;
  };
  const NON_ASCII = /[\u007f-\uffff]/g;
  const hex4 = (code) => call(strSlice, "0000" + call(numToString, code, 16), -4);
  const escapeChar = (c) => "\\u" + hex4(call(strCharCodeAt, c, 0));
  // JSON.stringify escapes control characters and lone surrogates; this escapes the rest.
  const asciiJSON = (value) => call(strReplace, stringify(value), NON_ASCII, escapeChar);
  const CONTROL = /[\u0000-\u001f\u007f]/;
  const fromCharCode = String.fromCharCode;
  // Text for the host (logs, notifications, SQL) must be well-formed to parse as strict JSON.
  const wellFormed = (text) => call(toWellFormed, text);

  class LimitError extends RealError {}
  class DriveError extends RealError {}

  // ---- run state, set by boot ---------------------------------------------------------------

  let limits = null;
  let runId = "";
  let journal = new RealMap(); // key -> {value, error, at, seq}
  let journalSize = 0;
  const unsettled = new RealSet(); // keys of steps with a row that is not settled
  let consumed = 0;
  const counters = new RealMap();
  let clock = 0;
  let outbox = [];
  const pending = new RealMap(); // id -> {onResult}
  let hits = []; // replayed entries whose promise waits for its turn
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

  let rngState = [1, 2, 3, 4];
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
    rngState = [(h1 ^ h2 ^ h3 ^ h4) >>> 0, (h2 ^ h1) >>> 0, (h3 ^ h1) >>> 0, (h4 ^ h1) >>> 0];
  }
  function random() {
    let [a, b, c, d] = rngState;
    const t = (((a + b) >>> 0) + d) >>> 0;
    d = (d + 1) >>> 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) >>> 0;
    c = (c << 21) | (c >>> 11);
    c = (c + t) >>> 0;
    rngState = [a >>> 0, b, c, d];
    return t / 4294967296;
  }
  // The clock only moves forward, to the time of each journal event the execution reaches.
  function reach(at, key) {
    if (typeof at === "number" && at > clock) clock = at;
    seed(runId + "\u0000" + key + "\u0000" + clock);
  }

  function LogicalDate(...args) {
    if (new.target === undefined) return call(RealDate.prototype.toString, new RealDate(clock));
    return construct(RealDate, args.length === 0 ? [clock] : args, new.target);
  }
  defineProperty(LogicalDate, "prototype", { value: RealDate.prototype });
  LogicalDate.now = () => clock;
  LogicalDate.parse = RealDate.parse;
  LogicalDate.UTC = RealDate.UTC;
  defineProperty(RealDate.prototype, "constructor", { value: LogicalDate });

  // ---- the tagged value encoding ------------------------------------------------------------

  function describeKind(value) {
    return typeof value === "function" ? "a function" : "a symbol";
  }

  function encode(value, where) {
    const ancestors = [];
    const budget = limits.value_bytes;
    function refuse(problem) {
      throw new LimitError(where + " " + problem);
    }
    function enc(v, depth) {
      if (depth > limits.value_depth) refuse(`is nested deeper than ${limits.value_depth} levels`);
      switch (typeof v) {
        case "undefined":
          return { $t: "undefined" };
        case "boolean":
          return v;
        case "string":
          // Lone surrogates are not valid in strict JSON parsers: carry the code units instead.
          return call(isWellFormed, v) ? v : { $t: "utf16", v: toHex16(v) };
        case "number":
          if (v !== v) return { $t: "NaN" };
          if (v === Infinity) return { $t: "Infinity" };
          if (v === -Infinity) return { $t: "-Infinity" };
          if (v === 0 && 1 / v < 0) return { $t: "-0" };
          return v;
        case "bigint":
          return v < 0n
            ? { $t: "bigint", v: "-" + call(bigToString, -v, 16) }
            : { $t: "bigint", v: call(bigToString, v, 16) };
        case "function":
        case "symbol":
          return refuse(`holds ${describeKind(v)}, which cannot be stored`);
      }
      if (v === null) return null;
      for (let i = 0; i < ancestors.length; i++) {
        if (ancestors[i] === v) refuse("holds a cycle, which cannot be stored");
      }
      append(ancestors, v);
      try {
        return encObject(v, depth);
      } finally {
        ancestors.length -= 1;
      }
    }
    function encObject(v, depth) {
      if (isArray(v)) {
        const length = v.length;
        if (length > budget) refuse(`is larger than the limit of ${budget} bytes`);
        const out = [];
        for (let i = 0; i < length; i++) append(out, enc(v[i], depth + 1));
        return out;
      }
      const time = brand(dateGetTime, v);
      if (time !== NOT) return { $t: "Date", v: time === time ? time : null };
      if (brand(mapSize, v) !== NOT) {
        const out = [];
        const it = call(mapEntries, v);
        for (let step = iteratorNext(it); !step.done; step = iteratorNext(it)) {
          append(out, [enc(step.value[0], depth + 2), enc(step.value[1], depth + 2)]);
        }
        return { $t: "Map", v: out };
      }
      if (brand(setSize, v) !== NOT) {
        const out = [];
        const it = call(setValues, v);
        for (let step = iteratorNext(it); !step.done; step = iteratorNext(it)) {
          append(out, enc(step.value, depth + 1));
        }
        return { $t: "Set", v: out };
      }
      const tag = isView(v) ? brand(typedArrayTag, v) : NOT;
      if (tag !== NOT) {
        if (tag === undefined) refuse("holds a DataView, which cannot be stored");
        const length = call(typedArrayByteLength, v);
        if (2 * length > budget) refuse(`is larger than the limit of ${budget} bytes`);
        const bytes = new RealUint8Array(call(typedArrayBuffer, v), call(typedArrayOffset, v), length);
        return { $t: tag, v: toHex(bytes) };
      }
      const bufferLength = brand(arrayBufferByteLength, v);
      if (bufferLength !== NOT) {
        if (2 * bufferLength > budget) refuse(`is larger than the limit of ${budget} bytes`);
        return { $t: "ArrayBuffer", v: toHex(new RealUint8Array(v)) };
      }
      const source = brand(regexpSource, v);
      if (source !== NOT) return { $t: "RegExp", v: source, flags: call(regexpFlags, v) };
      if (brand(promiseIs, v) !== NOT) {
        refuse("holds a Promise; await it before returning");
      }
      if (v instanceof RealError) {
        return { $t: "Error", name: safeString(v, "name", "Error"), message: safeString(v, "message", "") };
      }
      const out = createObject(null);
      const names = objectKeys(v);
      for (let i = 0; i < names.length; i++) {
        if (!call(isWellFormed, names[i])) refuse("has a property name with a lone surrogate");
        defineProperty(out, names[i], {
          value: enc(v[names[i]], depth + 1), enumerable: true, writable: true, configurable: true,
        });
      }
      return hasOwn(out, "$t") ? { $t: "object", v: out } : out;
    }
    const text = asciiJSON(enc(value, 1));
    if (text.length > budget) refuse(`is larger than the limit of ${budget} bytes`);
    return text;
  }

  const NOT = {};
  // Called with the value as `this`, like the getters above: only a real promise passes.
  function promiseIs() {
    call(promiseThen, this, undefined, undefined);
    return true;
  }
  function brand(fn, value) {
    try {
      return call(fn, value);
    } catch {
      return NOT;
    }
  }
  function toHex(bytes) {
    let out = "";
    for (let i = 0; i < bytes.length; i++) out += call(strSlice, "0" + call(numToString, bytes[i], 16), -2);
    return out;
  }
  function toHex16(text) {
    let out = "";
    for (let i = 0; i < text.length; i++) out += hex4(call(strCharCodeAt, text, i));
    return out;
  }
  function fromHex16(text) {
    let out = "";
    for (let i = 0; i < text.length; i += 4) out += fromCharCode(parseInt(call(strSlice, text, i, i + 4), 16));
    return out;
  }
  function fromHex(text) {
    const bytes = new RealUint8Array(text.length >>> 1);
    for (let i = 0; i < bytes.length; i++) bytes[i] = parseInt(call(strSlice, text, 2 * i, 2 * i + 2), 16);
    return bytes;
  }

  function decode(text) {
    return revive(parseJSON(text));
  }
  function revive(v) {
    if (v === null || typeof v !== "object") return v;
    if (isArray(v)) {
      const out = [];
      for (let i = 0; i < v.length; i++) append(out, revive(v[i]));
      return out;
    }
    if (!hasOwn(v, "$t")) return plainObject(v);
    switch (v.$t) {
      case "undefined": return undefined;
      case "NaN": return NaN;
      case "Infinity": return Infinity;
      case "-Infinity": return -Infinity;
      case "-0": return -0;
      case "utf16": return fromHex16(v.v);
      case "bigint":
        return call(strSlice, v.v, 0, 1) === "-" ? -RealBigInt("0x" + call(strSlice, v.v, 1)) : RealBigInt("0x" + v.v);
      case "Date": return new RealDate(v.v === null ? NaN : v.v);
      case "Map": {
        const map = new RealMap();
        for (let i = 0; i < v.v.length; i++) call(mapSet, map, revive(v.v[i][0]), revive(v.v[i][1]));
        return map;
      }
      case "Set": {
        const set = new RealSet();
        for (let i = 0; i < v.v.length; i++) call(setAdd, set, revive(v.v[i]));
        return set;
      }
      case "ArrayBuffer": return fromHex(v.v).buffer;
      case "RegExp": return new RealRegExp(v.v, v.flags);
      case "Error": {
        const error = new RealError(v.message);
        defineProperty(error, "name", { value: v.name, writable: true, configurable: true });
        return error;
      }
      case "object": return plainObject(v.v);
    }
    if (hasOwn(TYPED, v.$t)) {
      const bytes = fromHex(v.v);
      return new TYPED[v.$t](bytes.buffer, 0, bytes.length / TYPED[v.$t].BYTES_PER_ELEMENT);
    }
    throw new DriveError("the journal holds a value with an unknown tag: " + v.$t);
  }
  function plainObject(v) {
    const out = {};
    const names = objectKeys(v);
    for (let i = 0; i < names.length; i++) {
      defineProperty(out, names[i], {
        value: revive(v[names[i]]), enumerable: true, writable: true, configurable: true,
      });
    }
    return out;
  }

  // ---- thrown values become strings inside JS -----------------------------------------------

  function safeString(object, key, fallback) {
    let value;
    try {
      value = object[key];
    } catch {
      return fallback;
    }
    return typeof value === "string" ? call(strSlice, value, 0, 4000) : fallback;
  }
  function describe(thrown) {
    if (thrown !== null && (typeof thrown === "object" || typeof thrown === "function")) {
      return { name: safeString(thrown, "name", "Error"), message: safeString(thrown, "message", "") };
    }
    switch (typeof thrown) {
      case "string": return { name: "Error", message: call(strSlice, thrown, 0, 4000) };
      case "number":
      case "boolean":
      case "undefined": return { name: "Error", message: "" + thrown };
      case "bigint": return { name: "Error", message: "a BigInt was thrown" };
      default: return { name: "Error", message: "a " + typeof thrown + " was thrown" };
    }
  }
  // Engine errors that mean a limit was hit are reported by the limit's name.
  function limitMessage(error) {
    const { name, message } = describe(error);
    if (name === "InternalError" && (message === "out of memory" || message === "string too long")) {
      return `memory limit of ${limits.memory_bytes} bytes exceeded (${message})`;
    }
    if (name === "RangeError" && message === "Maximum call stack size exceeded") {
      return `stack limit of ${limits.stack_bytes} bytes exceeded`;
    }
    return null;
  }
  function makeError(failure) {
    const error = new RealError(failure.message);
    defineProperty(error, "name", { value: failure.name, writable: true, configurable: true });
    if (typeof failure.code === "string") {
      defineProperty(error, "code", { value: failure.code, writable: true, configurable: true });
    }
    return error;
  }

  // ---- durations and configs ----------------------------------------------------------------

  const UNIT_MS = {
    second: 1000, minute: 60000, hour: 3600000, day: 86400000,
    week: 604800000, month: 2592000000, year: 31536000000,
  };
  const DURATION = /^\s*(\d+(?:\.\d+)?)\s*(second|minute|hour|day|week|month|year)s?\s*$/;
  const MAX_DURATION_MS = 365 * 86400000;
  function durationMs(value, what) {
    let ms;
    if (typeof value === "number") {
      ms = value;
    } else if (typeof value === "string") {
      const match = DURATION.exec(value);
      if (match === null) {
        throw new RealTypeError(
          `${what}: ${stringify(call(strSlice, value, 0, 60))} is not a duration; use milliseconds ` +
            `or "N unit" with a unit of second, minute, hour, day, week, month or year`);
      }
      ms = Number(match[1]) * UNIT_MS[match[2]];
    } else {
      throw new RealTypeError(`${what} must be a number of milliseconds or a "N unit" string`);
    }
    if (!(ms >= 0) || ms > MAX_DURATION_MS) {
      throw new RealTypeError(`${what} must be from 0 ms to 365 days`);
    }
    return Math.floor(ms);
  }

  const DEFAULT_CONFIG = { retries: { limit: 5, delay: 10000, backoff: "exponential" }, timeout: 600000 };
  function checkKeys(object, allowed, what) {
    if (object === null || typeof object !== "object") throw new RealTypeError(`${what} must be an object`);
    const names = objectKeys(object);
    for (let i = 0; i < names.length; i++) {
      if (!hasOwn(allowed, names[i])) throw new RealTypeError(`${what} has an unknown key "${names[i]}"`);
    }
  }
  // Returns [config as the author sees it in ctx.config, normalized policy for the host].
  function stepConfig(config, what) {
    const merged = {
      retries: { ...DEFAULT_CONFIG.retries },
      timeout: DEFAULT_CONFIG.timeout,
    };
    if (config !== undefined) {
      checkKeys(config, { retries: 1, timeout: 1 }, what);
      if (config.retries !== undefined) {
        checkKeys(config.retries, { limit: 1, delay: 1, backoff: 1 }, what + ".retries");
        for (const key of ["limit", "delay", "backoff"]) {
          if (config.retries[key] !== undefined) merged.retries[key] = config.retries[key];
        }
      }
      if (config.timeout !== undefined) merged.timeout = config.timeout;
    }
    const limit = merged.retries.limit;
    if (typeof limit !== "number" || !(limit >= 0 && limit <= 1000) || limit !== Math.floor(limit)) {
      throw new RealTypeError(`${what}.retries.limit must be a whole number from 0 to 1000`);
    }
    const backoff = merged.retries.backoff;
    if (backoff !== "constant" && backoff !== "linear" && backoff !== "exponential") {
      throw new RealTypeError(`${what}.retries.backoff must be "constant", "linear" or "exponential"`);
    }
    const policy = {
      limit,
      delayMs: durationMs(merged.retries.delay, what + ".retries.delay"),
      backoff,
      timeoutMs: durationMs(merged.timeout, what + ".timeout"),
    };
    if (policy.timeoutMs === 0) throw new RealTypeError(`${what}.timeout must be more than 0 ms`);
    return [merged, policy];
  }
  function checkName(name, what) {
    if (typeof name !== "string" || name.length === 0 || name.length > limits.step_name_chars) {
      throw new RealTypeError(`${what} must be a string of 1 to ${limits.step_name_chars} characters`);
    }
    if (call(strTest, CONTROL, name)) throw new RealTypeError(`${what} must not contain control characters`);
    if (!call(isWellFormed, name)) throw new RealTypeError(`${what} must not contain lone surrogates`);
    return name;
  }

  // ---- the outbox ---------------------------------------------------------------------------

  function fail(message, retryable) {
    if (outcome === null) outcome = { status: "failed", retryable: !!retryable, message };
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
  const ROOT_SCOPE = { prefix: "", counters: new RealMap(), depth: 0 };
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
  function attemptScope(key) {
    if (currentScope.depth >= MAX_NESTING) {
      throw new LimitError(`steps nested deeper than ${MAX_NESTING} levels`);
    }
    return { prefix: key + "/", counters: new RealMap(), depth: currentScope.depth + 1 };
  }
  // A step call: answered from the journal (in journal order) or sent to the host.
  function request(kind, name, op, onAnswer, begin) {
    const count = occurrence(kind, name);
    const fullName = currentScope.prefix + name;
    const key = kind + ":" + count + ":" + fullName;
    const scope = currentScope;
    return new P((resolve, reject) => {
      const entry = journal.get(key);
      if (entry !== undefined) {
        append(hits, { entry, key, resolve, reject, scope });
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
  function valueAnswer(result, at, key, count, resolve, reject) {
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

  // ---- the step API -------------------------------------------------------------------------

  function stepDo(name, configOrFn, maybeFn) {
    try {
      checkName(name, "step.do name");
      const [config, fn] = typeof configOrFn === "function" ? [undefined, configOrFn] : [configOrFn, maybeFn];
      if (typeof fn !== "function") throw new RealTypeError(`step.do("${name}") needs a function`);
      const [merged, policy] = stepConfig(config, `step.do("${name}") config`);
      const op = { op: "step.check", step: name, kind: "do", config: policy };
      // A step the journal has never seen starts at once, announcing itself with a step.begin
      // that the host writes ahead of anything the body sends; a step with a row (retrying,
      // or in flight when a driver died) asks the host first.
      const begin = (key, count, fullName, resolve, rejectStep) => {
        send({ op: "step.begin", step: fullName, count, kind: "do", config: policy }, null);
        runAttempt(name, fullName, count, 1, merged, fn, key, resolve, rejectStep);
      };
      return request("do", name, op, (result, at, key, count, resolve, rejectStep, fullName) => {
        if (hasOwn(result, "value") && result.value !== null && result.value.hit === false) {
          reach(result.value.now, key + ":" + result.value.attempt);
          runAttempt(name, fullName, count, result.value.attempt, merged, fn, key, resolve, rejectStep);
        } else if (hasOwn(result, "value") && result.value !== null && result.value.hit === true) {
          reach(at, key);
          resolve(decode(result.value.value));
        } else {
          valueAnswer(result, at, key, count, resolve, rejectStep);
        }
      }, begin);
    } catch (error) {
      return reject(error);
    }
  }
  function runAttempt(name, fullName, count, attempt, config, fn, key, resolve, rejectStep) {
    const ctx = freeze({ step: freeze({ name, count }), attempt, config: deepFreeze(config) });
    const where = `step "${name}" (#${count})`;
    const outer = currentScope; // the caller's scope: the step's own promise resumes it
    const record = (fields) => {
      const saved = currentScope;
      currentScope = outer;
      try {
        recordIn(fields);
      } finally {
        currentScope = saved;
      }
    };
    const recordIn = (fields) => {
      send({ op: "step.record", step: fullName, count, attempt, ...fields }, (result, at) => {
        if (hasOwn(result, "value")) {
          reach(at, key);
          // A string is the value another writer settled first: the first writer wins.
          if (typeof result.value === "string") resolve(decode(result.value));
          else if (hasOwn(fields, "value")) resolve(decode(fields.value));
          else rejectStep(makeError(fields.error));
        } else {
          valueAnswer(result, at, key, count, resolve, rejectStep);
        }
      });
    };
    let started;
    try {
      currentScope = attemptScope(key);
      started = P.resolve(fn(ctx));
    } catch (error) {
      started = P.reject(error);
    } finally {
      currentScope = outer;
    }
    call(promiseThen, started, (value) => {
      let text;
      try {
        text = encode(value, `the result of ${where}`);
      } catch (error) {
        fail(error instanceof LimitError ? error.message : describe(error).message, false);
        return;
      }
      record({ value: text });
    }, (thrown) => {
      const limit = thrown instanceof LimitError ? thrown.message : limitMessage(thrown);
      if (limit !== null) {
        fail(`${where}: ${limit}`, false);
        return;
      }
      record({ error: stepFailure(thrown, where) });
    });
  }
  function stepFailure(thrown, where) {
    const { name, message } = describe(thrown);
    const failure = { name, message, retryable: name !== "FatalError" && name !== "NonRetryableError" };
    if (name === "RetryableError" && thrown !== null && typeof thrown === "object") {
      let after;
      try {
        after = thrown.retryAfter;
      } catch {
        after = undefined;
      }
      if (after !== undefined) {
        try {
          failure.retryAfterMs = durationMs(after, `${where} retryAfter`);
        } catch (error) {
          failure.message += ` (ignored retryAfter: ${describe(error).message})`;
        }
      }
    }
    return failure;
  }
  function deepFreeze(value) {
    if (value !== null && typeof value === "object" && !isFrozen(value)) {
      freeze(value);
      const names = objectKeys(value);
      for (let i = 0; i < names.length; i++) deepFreeze(value[names[i]]);
    }
    return value;
  }

  function stepSleep(name, duration) {
    try {
      checkName(name, "step.sleep name");
      const ms = durationMs(duration, `step.sleep("${name}") duration`);
      return request("sleep", name, { op: "step.sleep", step: name, ms }, valueAnswer);
    } catch (error) {
      return reject(error);
    }
  }
  function stepSleepUntil(name, when) {
    try {
      checkName(name, "step.sleepUntil name");
      let until = when;
      const time = brand(dateGetTime, when);
      if (time !== NOT) until = time;
      if (typeof until !== "number" || !(until >= 0) || until > 8.64e15) {
        throw new RealTypeError(`step.sleepUntil("${name}") needs a Date or epoch milliseconds`);
      }
      if (until - clock > MAX_DURATION_MS) {
        throw new RealTypeError(`step.sleepUntil("${name}") is more than 365 days ahead`);
      }
      return request("sleep", name, { op: "step.sleep", step: name, until: Math.floor(until) }, valueAnswer);
    } catch (error) {
      return reject(error);
    }
  }
  const EVENT_TYPE = /^[A-Za-z0-9_.:-]{1,100}$/;
  function stepWaitForEvent(name, options) {
    try {
      checkName(name, "step.waitForEvent name");
      const what = `step.waitForEvent("${name}") options`;
      checkKeys(options, { type: 1, timeout: 1 }, what);
      if (typeof options.type !== "string" || !call(strTest, EVENT_TYPE, options.type)) {
        throw new RealTypeError(`${what}.type must be 1-100 characters of A-Z, a-z, 0-9, _ . : -`);
      }
      const timeoutMs = options.timeout === undefined ? 86400000 : durationMs(options.timeout, what + ".timeout");
      const op = { op: "step.waitForEvent", step: name, type: options.type, timeoutMs };
      return request("waitForEvent", name, op, valueAnswer);
    } catch (error) {
      return reject(error);
    }
  }
  function stepTool(name, address, args, config) {
    try {
      checkName(name, "step.tool name");
      if (typeof address !== "string" || address.length === 0 || address.length > 256 ||
          call(strTest, CONTROL, address) || !call(isWellFormed, address)) {
        throw new RealTypeError(`step.tool("${name}") address must be a string of 1 to 256 characters`);
      }
      const [, policy] = stepConfig(config, `step.tool("${name}") config`);
      const encoded = encode(args, `the arguments of step.tool("${name}")`);
      const op = { op: "step.tool", step: name, address, args: encoded, config: policy };
      return request("tool", name, op, valueAnswer);
    } catch (error) {
      return reject(error);
    }
  }
  function stepNotify(message) {
    try {
      checkKeys(message, { title: 1, body: 1, link: 1 }, "step.notify message");
      const text = (key, max, required) => {
        const value = message[key];
        if (value === undefined && !required) return undefined;
        if (typeof value !== "string" || value.length > max || (required && value.length === 0)) {
          throw new RealTypeError(`step.notify ${key} must be a string of at most ${max} characters`);
        }
        return wellFormed(value);
      };
      const op = { op: "step.notify", title: text("title", 256, true), body: text("body", 4096, false), link: text("link", 2048, false) };
      notifies += 1;
      if (notifies > limits.notify_per_drive) {
        throw new LimitError(`notify per drive limit of ${limits.notify_per_drive} exceeded`);
      }
      return request("notify", "", op, valueAnswer);
    } catch (error) {
      return reject(error);
    }
  }
  function dbSql(sql, params) {
    try {
      if (typeof sql !== "string" || sql.length === 0 || sql.length > 100000 || !call(isWellFormed, sql)) {
        throw new RealTypeError("db.sql needs well-formed SQL text of 1 to 100000 characters");
      }
      const list = params === undefined ? [] : params;
      if (!isArray(list)) throw new RealTypeError("db.sql params must be an array");
      const op = { op: "db.sql", sql, params: encode(list, "the params of db.sql") };
      return request("sql", "", op, valueAnswer);
    } catch (error) {
      return reject(error);
    }
  }

  // console output: captured per run, never emitted again while replaying.
  function logger(level) {
    return (...args) => {
      logCount += 1;
      if (logCount <= logsSeen) return; // printed by an earlier drive of this run
      let text = "";
      for (let i = 0; i < args.length; i++) {
        const arg = args[i];
        let part;
        if (typeof arg === "string") part = arg;
        else if (arg !== null && typeof arg === "object") {
          try {
            part = stringify(arg);
          } catch {
            part = "[unprintable]";
          }
          if (typeof part !== "string") part = "[unprintable]";
        } else part = typeof arg === "bigint" || typeof arg === "symbol" ? "[" + typeof arg + "]" : "" + arg;
        text += (i ? " " : "") + part;
        if (text.length > 16384) break;
      }
      text = wellFormed(call(strSlice, text, 0, 16384));
      logBytes += text.length;
      if (logBytes > limits.log_bytes_per_drive) return;
      send({ op: "log", level, text, count: logCount }, null);
    };
  }

  // ---- lockdown -----------------------------------------------------------------------------

  // Assignments like `this.name = "X"` in an Error subclass must keep working once the
  // prototypes are frozen (the "override mistake"): such data properties become accessors
  // whose setter defines an own property on the receiver.
  function enableOverride(object, name) {
    const desc = getOwnPropertyDescriptor(object, name);
    if (!desc || !hasOwn(desc, "value") || !desc.configurable) return;
    const value = desc.value;
    defineProperty(object, name, {
      get() {
        return value;
      },
      set(next) {
        if (this === object) throw new RealTypeError(`cannot assign to frozen ${name}`);
        if (hasOwn(this, name)) this[name] = next;
        else defineProperty(this, name, { value: next, writable: true, enumerable: true, configurable: true });
      },
      enumerable: desc.enumerable,
      configurable: false,
    });
  }
  // Freeze every object author code could use to change shared behaviour: namespaces,
  // constructors, prototypes. A plain method (a function with no own `prototype`) is left as it
  // is: its own properties are read-only already, and new ones change nothing the prelude or
  // other code relies on. This keeps preparing a context cheap.
  function harden(roots) {
    const seen = new RealSet();
    const queue = [...roots];
    while (queue.length) {
      const object = queue.pop();
      if (object === null || (typeof object !== "object" && typeof object !== "function")) continue;
      if (seen.has(object) || object === G) continue;
      seen.add(object);
      freeze(object);
      append(queue, getPrototypeOf(object));
      const names = ownKeys(object);
      for (let i = 0; i < names.length; i++) {
        const desc = getOwnPropertyDescriptor(object, names[i]);
        const value = desc.value;
        if (value !== null && typeof value === "object") append(queue, value);
        else if (typeof value === "function" && hasOwn(value, "prototype")) append(queue, value);
      }
    }
  }
  function lockdown(runtime) {
    for (const name of ["WeakRef", "FinalizationRegistry", "performance", "SharedArrayBuffer", "Atomics"]) {
      delete G[name];
    }
    G.Date = LogicalDate;
    Math.random = random;
    const overrides = [
      [O.prototype, ["constructor", "toString", "toLocaleString", "valueOf", "hasOwnProperty", "isPrototypeOf", "propertyIsEnumerable"]],
      [Function.prototype, ["constructor", "toString"]],
      [Array.prototype, ["constructor", "toString"]],
    ];
    for (const errorClass of [RealError, RealTypeError, RangeError, SyntaxError, ReferenceError, EvalError, URIError, AggregateError, InternalError]) {
      append(overrides, [errorClass.prototype, ["constructor", "name", "message", "toString"]]);
    }
    for (const [object, names] of overrides) for (const name of names) enableOverride(object, name);
    defineProperty(G, "console", {
      value: { log: logger("log"), info: logger("info"), warn: logger("warn"), error: logger("error"), debug: logger("log") },
      writable: false, configurable: false, enumerable: false,
    });
    defineProperty(G, "__qjsflow", { value: runtime, writable: false, configurable: false, enumerable: false });
    const roots = [];
    const names = ownKeys(G);
    for (let i = 0; i < names.length; i++) {
      const desc = getOwnPropertyDescriptor(G, names[i]);
      if (hasOwn(desc, "value")) {
        append(roots, desc.value);
        if (desc.configurable) defineProperty(G, names[i], { writable: false, configurable: false });
      }
    }
    for (const sample of [async function () {}, function* () {}, async function* () {}]) {
      append(roots, sample);
      append(roots, sample.prototype);
    }
    append(roots, [][Symbol.iterator]());
    append(roots, new RealMap().entries());
    append(roots, new RealSet().values());
    append(roots, ""[Symbol.iterator]());
    append(roots, call(RealRegExp.prototype[Symbol.matchAll], /a/g, "a"));
    harden(roots);
  }

  // ---- the body -----------------------------------------------------------------------------

  function findEntry(namespace) {
    if (namespace === null || typeof namespace !== "object") {
      throw new DriveError("the bundle defines no module");
    }
    const isClass = (value) => typeof value === "function" && value.prototype !== undefined &&
      value.prototype !== null && typeof value.prototype.run === "function";
    if (typeof namespace.default === "function") return namespace.default;
    const classes = [];
    const names = objectKeys(namespace);
    for (let i = 0; i < names.length; i++) if (isClass(namespace[names[i]])) append(classes, namespace[names[i]]);
    if (classes.length === 1) return classes[0];
    throw new DriveError(classes.length === 0
      ? "the workflow module exports no workflow: export default a function, or a class with run()"
      : "the workflow module exports several classes with run(); export the workflow as default");
  }

  // Run-independent: done ahead of the drive, while the executor would otherwise be idle.
  const db = freeze({ sql: dbSql });
  const step = freeze({
    do: stepDo, sleep: stepSleep, sleepUntil: stepSleepUntil, waitForEvent: stepWaitForEvent,
    tool: stepTool, notify: stepNotify,
  });
  let prepared = false;
  function prepare() {
    lockdown(freeze({ db }));
    prepared = true;
  }

  function boot(request) {
    if (!prepared) prepare();
    limits = request.limits;
    runId = request.runId;
    clock = request.createdAtMs;
    for (let i = 0; i < request.journal.length; i++) {
      const entry = request.journal[i];
      journal.set(entry.key, { value: entry.value, error: entry.error, at: entry.at, seq: i });
    }
    journalSize = request.journal.length;
    for (let i = 0; i < request.unsettled.length; i++) unsettled.add(request.unsettled[i]);
    logsSeen = request.logsSeen;
    reach(clock, "start");
    const env = decode(request.env);
    defineProperty(env, "db", { value: db, enumerable: true });
    freeze(env);
    const event = freeze({
      payload: decode(request.input),
      timestamp: new RealDate(request.createdAtMs),
      instanceId: request.runId,
      workflowName: request.workflow,
    });
    moduleBody = { step, env, event };
  }

  function load(code) {
    (0, EVAL)(code);
  }

  function start() {
    const entry = findEntry(G.__qjsflow_module);
    const { step, env, event } = moduleBody;
    let body;
    try {
      if (entry.prototype !== undefined && entry.prototype !== null && typeof entry.prototype.run === "function") {
        const instance = new entry(freeze({}), env);
        body = instance.run(event, step);
      } else {
        body = entry(event, step, env);
      }
    } catch (thrown) {
      body = P.reject(thrown);
    }
    call(promiseThen, P.resolve(body), (value) => {
      try {
        const output = encode(value, "the workflow's result");
        if (outcome === null) outcome = { status: "completed", output };
      } catch (error) {
        fail(error instanceof LimitError ? error.message : describe(error).message, false);
      }
    }, (thrown) => {
      const limit = limitMessage(thrown);
      const { name, message } = describe(thrown);
      fail(limit !== null ? limit : `${name}: ${message}`, false);
    });
  }

  // Settle the replayed entry that comes first in the journal, if one is waiting.
  function nextHit() {
    if (hits.length === 0) return false;
    let best = 0;
    for (let i = 1; i < hits.length; i++) if (hits[i].entry.seq < hits[best].entry.seq) best = i;
    const hit = hits[best];
    hits[best] = hits[hits.length - 1];
    hits.length -= 1;
    settleHit(hit);
    return true;
  }

  function answer(message) {
    const waiting = pending.get(message.id);
    if (waiting === undefined) throw new DriveError("the host answered an unknown op " + message.id);
    pending.delete(message.id);
    currentScope = waiting.scope;
    waiting.onResult(message.result, message.at);
  }

  function finish() {
    if (outcome !== null) return outcome;
    if (markers.length > 0) return { status: "suspended", markers };
    return {
      status: "failed", retryable: false,
      message: "the workflow awaited something that can never resolve (a promise no step settles)",
    };
  }

  // ---- dispatch: the executor's only entry point ---------------------------------------------

  // Every command returns ASCII JSON: {ok: ...} or {error: {name, message, limit}}.
  return function dispatch(command, argument) {
    try {
      switch (command) {
        case "prepare": prepare(); return "{}";
        case "boot": boot(parseJSON(argument)); return "{}";
        case "load": load(argument); return "{}";
        case "start": start(); return "{}";
        case "hit": return nextHit() ? "1" : "0";
        case "answer": answer(parseJSON(argument)); return "{}";
        case "take": {
          const taken = outbox;
          outbox = [];
          return taken.length === 0 ? "" : asciiJSON(taken);
        }
        case "outcome": return outcome === null ? "" : asciiJSON(outcome);
        case "takeLogs": {
          // At the end of a drive only console output still goes out: a step call nobody
          // awaited must not run after the body has finished.
          const logs = [];
          for (let i = 0; i < outbox.length; i++) if (outbox[i].op.op === "log") append(logs, outbox[i]);
          outbox = [];
          return logs.length === 0 ? "" : asciiJSON(logs);
        }
        case "finish": return asciiJSON(finish());
      }
      return asciiJSON({ error: { name: "DriveError", message: "unknown command " + command } });
    } catch (thrown) {
      const limit = limitMessage(thrown);
      const { name, message } = describe(thrown);
      return asciiJSON({ error: { name, message: limit !== null ? limit : message, limit: limit !== null } });
    }
  };
})();
