// Thrown values as strings, durations, step configs and names.

// ---- thrown values become strings inside JS -----------------------------------------------
// Names and messages are made well-formed here (a lone surrogate becomes U+FFFD): they travel
// as plain JSON text, which the host parses strictly, not as tagged values.

function safeString(object, key, fallback) {
  let value;
  try {
    value = object[key];
  } catch {
    return fallback;
  }
  return typeof value === "string" ? value : fallback;
}
// Cut to what the wire carries (a lone surrogate left by the cut is made well-formed too).
const errorText = (text, max) => wellFormed(call(strSlice, text, 0, max));
function describe(thrown) {
  if (thrown !== null && (typeof thrown === "object" || typeof thrown === "function")) {
    return {
      name: errorText(safeString(thrown, "name", "Error"), RULES.error_name_chars),
      message: errorText(safeString(thrown, "message", ""), RULES.error_message_chars),
      stack: errorText(safeString(thrown, "stack", ""), RULES.stack_chars),
    };
  }
  const plain = (message) => ({ name: "Error", message, stack: "" });
  switch (typeof thrown) {
    case "string": return plain(errorText(thrown, RULES.error_message_chars));
    case "number":
    case "boolean":
    case "undefined": return plain("" + thrown);
    case "bigint": return plain("a BigInt was thrown");
    default: return plain("a " + typeof thrown + " was thrown");
  }
}
// Engine errors that mean a limit was hit are reported by the limit's name.
// (`limits` is null until boot has read the request: a request too big to read is itself a
// memory limit.)
// The engine's interrupt, caught as a rejection before the executor saw its budget run out:
// a limit (the executor names which budget), never a step's or the author's error.
const COMPUTE_STOPPED = "compute limit exceeded";
function limitMessage(error) {
  const { name, message } = describe(error);
  if (name === "InternalError" && message === "interrupted") return COMPUTE_STOPPED;
  if (name === "InternalError" && (message === "out of memory" || message === "string too long")) {
    const bytes = limits === null ? "the run's" : `${limits.memory_bytes} bytes`;
    return `memory limit of ${bytes} exceeded (${message})`;
  }
  if (name === "RangeError" && message === "Maximum call stack size exceeded") {
    return limits === null ? "stack limit exceeded" : `stack limit of ${limits.stack_bytes} bytes exceeded`;
  }
  return null;
}
function makeError(failure) {
  const error = new RealError(failure.message);
  defineProperty(error, "name", { value: failure.name, writable: true, configurable: true });
  if (typeof failure.code === "string") {
    defineProperty(error, "code", { value: failure.code, writable: true, configurable: true });
  }
  // Where the step threw: a run that fails with this error is located there too.
  if (typeof failure.stack === "string") {
    defineProperty(error, "stack", { value: failure.stack, writable: true, configurable: true });
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

const DEFAULT_CONFIG = {
  retries: {
    limit: RULES.default_retry_limit,
    delay: RULES.default_retry_delay_ms,
    backoff: /** @type {string} */ (RULES.default_retry_backoff),
  },
  timeout: RULES.default_timeout_ms,
};
// Options are read once, into a copy that every check and the op then use: a getter or a
// Proxy cannot show the checks one value and the op another.
function readOptions(object, allowed, what) {
  if (object === null || typeof object !== "object") throw new RealTypeError(`${what} must be an object`);
  const names = objectKeys(object);
  const copy = createObject(null);
  for (let i = 0; i < names.length; i++) {
    if (!hasOwn(allowed, names[i])) throw new RealTypeError(`${what} has an unknown key "${names[i]}"`);
    copy[names[i]] = object[names[i]];
  }
  return copy;
}
// Returns [config as the author sees it in ctx.config, normalized policy for the host].
// A call without a config (most) shares one, made once: it is frozen when a body sees it.
let defaultStepConfig = null;
// `api` and `name` say whose config a refused one is (built only then: not a string a step).
function stepConfig(config, api, name) {
  if (config === undefined) {
    if (defaultStepConfig === null) defaultStepConfig = checkedStepConfig(undefined, "the default step config");
    return defaultStepConfig;
  }
  return checkedStepConfig(config, `${api}("${name}") config`);
}
// A policy as an op carries it (`stepConfig`'s second half): the default one, which most calls
// have, as `{}`, which the host reads as RULES' default, so that a frame does not repeat it
// for every step (~70 characters each: 2 % of a ten-step drive's work went to writing and
// looking through them).
const DEFAULT_POLICY_ON_WIRE = freeze({});
function policyOnWire(checked) {
  return checked === defaultStepConfig ? DEFAULT_POLICY_ON_WIRE : checked[1];
}
function checkedStepConfig(config, what) {
  const merged = {
    retries: { ...DEFAULT_CONFIG.retries },
    timeout: DEFAULT_CONFIG.timeout,
  };
  if (config !== undefined) {
    const given = readOptions(config, { retries: 1, timeout: 1 }, what);
    if (given.retries !== undefined) {
      const retries = readOptions(given.retries, { limit: 1, delay: 1, backoff: 1 }, what + ".retries");
      for (const key of ["limit", "delay", "backoff"]) {
        if (retries[key] !== undefined) merged.retries[key] = retries[key];
      }
    }
    if (given.timeout !== undefined) merged.timeout = given.timeout;
  }
  const limit = merged.retries.limit;
  if (typeof limit !== "number" || !(limit >= 0 && limit <= 1000) || limit !== Math.floor(limit)) {
    throw new RealTypeError(`${what}.retries.limit must be a whole number from 0 to 1000`);
  }
  const backoff = merged.retries.backoff;
  if (backoff !== "constant" && backoff !== "linear" && backoff !== "exponential") {
    throw new RealTypeError(`${what}.retries.backoff must be "constant", "linear" or "exponential"`);
  }
  // A delay may be a function of the failed attempt ({ ctx, error }) => duration, called by
  // the attempt's failure (attemptThrew); the host then takes the delay the failure carries.
  const delay = merged.retries.delay;
  const policy = {
    limit,
    delayMs: typeof delay === "function" ? 0 : durationMs(delay, what + ".retries.delay"),
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
