// The step API: step.do, sleep, sleepUntil, waitForEvent, tool, notify, db.sql, console.

// ---- the step API -------------------------------------------------------------------------

// A step.do call made six closures of its own, three for the call and three for each attempt
// (a quarter of a pure step's): what it was given is one object (`spec`: its name,
// function, merged config and the host's policy), each attempt another (`run`), and the
// functions that serve them are made once.
function stepDo(name, configOrFn, maybeFn, maybeOptions) {
  try {
    checkName(name, "step.do name");
    // (No destructuring on this path: each would make an array and its iterator a step.)
    const direct = typeof configOrFn === "function";
    const config = direct ? undefined : configOrFn;
    const fn = direct ? configOrFn : maybeFn;
    if (typeof fn !== "function") throw new RealTypeError(`step.do("${name}") needs a function`);
    const checked = stepConfig(config, "step.do", name);
    const spec = { name, fn, config: checked[0], policy: policyOnWire(checked) };
    const op = { op: "step.check", step: name, kind: "do", config: spec.policy };
    const promise = request("do", name, op, checkAnswered, beginStep, spec);
    const options = direct ? maybeFn : maybeOptions;
    if (options !== undefined) registerRollback(name, checked[0], options, promise);
    return promise;
  } catch (error) {
    return reject(error);
  }
}
// A step the journal has never seen starts at once, announcing itself with a step.begin that
// the host writes ahead of anything the body sends; a step with a row (retrying, or in flight
// when a driver died) asks the host first (`checkAnswered`).
function beginStep(spec, key, count, fullName, resolve, rejectStep, stepCall) {
  const opening = send({ op: "step.begin", step: fullName, count, kind: "do", config: spec.policy }, null);
  opening[UNSENT] = true;
  runAttempt(spec, fullName, count, 1, key, resolve, rejectStep, { opening, stepCall });
}
function checkAnswered(result, at, key, count, resolve, rejectStep, fullName, spec) {
  const value = hasOwn(result, "value") ? result.value : null;
  if (value !== null && value.hit === false) {
    runAttempt(spec, fullName, count, value.attempt, key, resolve, rejectStep, { now: value.now });
  } else if (value !== null && value.hit === true) {
    reach(at, key);
    resolve(decode(value.value));
  } else {
    valueAnswer(result, at, key, count, resolve, rejectStep);
  }
}
// After a short retry delay waited inside the drive: ask for the next attempt again.
function askAgain(spec, key, count, fullName, resolve, rejectStep) {
  send(
    { op: "step.check", step: fullName, count, kind: "do", config: spec.policy },
    (result, at) => checkAnswered(result, at, key, count, resolve, rejectStep, fullName, spec),
  );
}
// `began`: how the attempt started: `{ now }`, the host's time, when the host was asked, or
// `{ opening, stepCall }`, the step.begin message and the call, when the sandbox began it
// without asking.
function runAttempt(spec, fullName, count, attempt, key, resolve, rejectStep, began) {
  const ctx = freeze({ step: freeze({ name: spec.name, count }), attempt, config: deepFreeze(spec.config) });
  // `outer`: the caller's scope, which the step's own promise resumes; `own`: the attempt's.
  const run = {
    spec, fullName, count, attempt, key, resolve, rejectStep, began, outer: currentScope, own: ROOT_SCOPE,
    fields: null,
  };
  if (attempt > 1) forgetFailedCalls(key);
  let started;
  try {
    run.own = attemptScope(key, attempt, began.now);
    currentScope = run.own;
    const fn = spec.fn; // called bare: `spec` is the prelude's, never the body's `this`
    started = P.resolve(fn(ctx));
  } catch (error) {
    started = P.reject(error);
  } finally {
    currentScope = run.outer;
  }
  call(promiseThen, started, (value) => attemptReturned(run, value), (thrown) => attemptThrew(run, thrown));
}
// Where the attempt is, for errors only (the template made for every step was ~2 % of a pure one).
function attemptWhere(run) {
  return `step "${run.spec.name}" (#${run.count})`;
}
function attemptReturned(run, value) {
  let text;
  try {
    text = encode(value, () => `the result of ${attemptWhere(run)}`, "keep the handle");
  } catch (error) {
    fail(error instanceof LimitError ? error.message : describe(error).message, false);
    return;
  }
  record(run, { value: text });
}
function attemptThrew(run, thrown) {
  const limit = thrown instanceof LimitError ? thrown.message : limitMessage(thrown);
  if (limit !== null) {
    fail(`${attemptWhere(run)}: ${limit}`, false);
    return;
  }
  const failure = stepFailure(thrown, attemptWhere(run));
  const delay = run.spec.config.retries.delay;
  if (typeof delay === "function" && failure.retryable && failure.retryAfterMs === undefined &&
      run.attempt <= run.spec.config.retries.limit && !chooseDelay(run, delay, thrown, failure)) {
    return;
  }
  record(run, { error: failure });
}
// A dynamic retry delay: run once, as this attempt fails (its answer is recorded with the
// failure, so a replay never runs it again); one that throws, or gives no duration, ends the
// step's retries, saying why. False when the function met the drive's own limits (the drive
// fails, as for the step's body).
function chooseDelay(run, delay, thrown, failure) {
  const where = attemptWhere(run);
  try {
    const ctx = freeze({ step: freeze({ name: run.spec.name, count: run.count }), attempt: run.attempt, config: run.spec.config });
    const chosen = delay({ ctx, error: thrown });
    if (chosen !== null && typeof chosen === "object" && typeof chosen.then === "function") {
      throw new RealTypeError("it returned a promise: return a duration");
    }
    failure.retryAfterMs = durationMs(chosen, `${where} retries.delay`);
  } catch (error) {
    const limit = error instanceof LimitError ? error.message : limitMessage(error);
    if (limit !== null) {
      fail(`${where}: ${limit}`, false);
      return false;
    }
    failure.retryable = false;
    failure.message = errorText(`${failure.message} (no more retries: the retry delay function failed: ` +
      `${describe(error).message})`, RULES.error_message_chars);
  }
  return true;
}
// The attempt's result, sent in the caller's scope.
function record(run, fields) {
  const saved = currentScope;
  currentScope = run.outer;
  try {
    run.fields = fields;
    const op = {
      op: "step.record", step: run.fullName, count: run.count, attempt: run.attempt, value: fields.value,
      error: fields.error,
    };
    const message = send(op, recordAnswered, run);
    // Begun in this drive without asking, and pure: the sandbox may settle it (OPENING).
    if (run.began.opening !== undefined && hasOwn(fields, "value") && !run.own.effectful) {
      message[OPENING] = run.began.opening;
      message[CALL] = run.began.stepCall;
      settleEarly();
    }
  } finally {
    currentScope = saved;
  }
}
function recordAnswered(result, at, run) {
  const fields = run.fields;
  if (hasOwn(result, "value") && result.value !== null && typeof result.value === "object") {
    // A short retry: wait inside the drive, then run the next attempt in this context. If
    // the drive ends first, the marker suspends the run on the (journaled) retry.
    const marker = { suspend: "retry", event: undefined };
    append(markers, marker);
    addTimer(() => {
      const index = call(arrayIndexOf, markers, marker);
      if (index >= 0) markers.splice(index, 1);
      askAgain(run.spec, run.key, run.count, run.fullName, run.resolve, run.rejectStep);
    }, result.value.retryIn + 2, [], false, true); // +2: past the due time, at ms precision
  } else if (hasOwn(result, "value")) {
    reach(at, run.key);
    // A string is the value another writer settled first: the first writer wins.
    if (typeof result.value === "string") run.resolve(decode(result.value));
    else if (hasOwn(fields, "value")) run.resolve(decode(fields.value));
    else run.rejectStep(makeError(fields.error));
  } else {
    valueAnswer(result, at, run.key, run.count, run.resolve, run.rejectStep);
  }
}
// A new attempt of a step makes again the calls inside it that failed in an earlier one (the
// host reopened their rows when it began the attempt); those that succeeded keep their result.
function forgetFailedCalls(key) {
  const inside = ":" + key + "/";
  const failed = [];
  journal.forEach((entry, entryKey) => {
    if (entry.error && call(strIndexOf, entryKey, inside) >= 0) append(failed, entryKey);
  });
  for (let i = 0; i < failed.length; i++) {
    journal.delete(failed[i]);
    unsettled.add(failed[i]);
  }
}
function stepFailure(thrown, where) {
  const { name, message, stack } = describe(thrown);
  const failure = { name, message, retryable: name !== "FatalError" && name !== "NonRetryableError" };
  if (stack) failure.stack = stack;
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
  // The one place a failure's texts are fitted to the wire, after every addition to them: a
  // text the host refuses would fail the run as a broken protocol, not as the author's error.
  failure.name = errorText(failure.name, RULES.error_name_chars);
  failure.message = errorText(failure.message, RULES.error_message_chars);
  if (stack) failure.stack = errorText(stack, RULES.stack_chars);
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

// A body's attempt runs within one drive (its result is recorded when it returns), so it
// cannot suspend: sleeping or waiting belongs between steps.
function outsideBodies(api, name) {
  if (currentScope !== ROOT_SCOPE) {
    throw new RealTypeError(
      `${api}("${name}") cannot be called inside a step.do body: sleep or wait between steps`);
  }
}
function stepSleep(name, duration) {
  try {
    checkName(name, "step.sleep name");
    outsideBodies("step.sleep", name);
    const ms = durationMs(duration, `step.sleep("${name}") duration`);
    return request("sleep", name, { op: "step.sleep", step: name, ms }, valueAnswer);
  } catch (error) {
    return reject(error);
  }
}
function stepSleepUntil(name, when) {
  try {
    checkName(name, "step.sleepUntil name");
    outsideBodies("step.sleepUntil", name);
    let until = when;
    const time = brand(dateGetTime, when);
    if (time !== NOT) until = time;
    if (typeof until !== "number" || !(until >= 0) || until > 8.64e15) {
      throw new RealTypeError(`step.sleepUntil("${name}") needs a Date or epoch milliseconds`);
    }
    if (until - currentScope.clock > MAX_DURATION_MS) {
      throw new RealTypeError(`step.sleepUntil("${name}") is more than 365 days ahead`);
    }
    return request("sleep", name, { op: "step.sleep", step: name, until: Math.floor(until) }, valueAnswer);
  } catch (error) {
    return reject(error);
  }
}
const EVENT_TYPE = new RealRegExp(`^(?:${RULES.event_type_pattern})$`);
function stepWaitForEvent(name, options) {
  try {
    checkName(name, "step.waitForEvent name");
    outsideBodies("step.waitForEvent", name);
    const what = `step.waitForEvent("${name}") options`;
    const given = readOptions(options, { type: 1, timeout: 1 }, what);
    if (typeof given.type !== "string" || !call(strTest, EVENT_TYPE, given.type)) {
      throw new RealTypeError(`${what}.type must be ${RULES.event_type_rule}`);
    }
    const timeoutMs = given.timeout === undefined ? 86400000 : durationMs(given.timeout, what + ".timeout");
    const op = { op: "step.waitForEvent", step: name, type: given.type, timeoutMs };
    return request("waitForEvent", name, op, valueAnswer);
  } catch (error) {
    return reject(error);
  }
}
const NESTED_TOOL_CONFIG = freeze({ retries: freeze({ limit: 0 }) });
function stepTool(name, address, args, config) {
  try {
    checkName(name, "step.tool name");
    const most = RULES.tool_address_chars;
    if (typeof address !== "string" || address.length === 0 || address.length > most ||
        call(strTest, CONTROL, address) || !call(isWellFormed, address)) {
      throw new RealTypeError(`step.tool("${name}") address must be a string of 1 to ${most} characters`);
    }
    // Inside a step body a tool has no retries of its own unless given some: its failure fails
    // the attempt with the tool's own error, and the enclosing step's policy decides.
    const given = config === undefined && currentScope.depth > 0 ? NESTED_TOOL_CONFIG : config;
    const policy = policyOnWire(stepConfig(given, "step.tool", name));
    const encoded = encode(args, `the arguments of step.tool("${name}")`, "pass to the host");
    const op = { op: "step.tool", step: name, address, args: encoded, config: policy };
    return request("tool", name, op, valueAnswer);
  } catch (error) {
    return reject(error);
  }
}
function stepNotify(message) {
  try {
    const given = readOptions(message, { title: 1, body: 1, link: 1 }, "step.notify message");
    const text = (key, max, required) => {
      const value = given[key];
      if (value === undefined && !required) return undefined;
      if (typeof value !== "string" || value.length > max || (required && value.length === 0)) {
        throw new RealTypeError(`step.notify ${key} must be a string of at most ${max} characters`);
      }
      return wellFormed(value);
    };
    const op = {
      op: "step.notify",
      title: text("title", RULES.notify_title_chars, true),
      body: text("body", RULES.notify_body_chars, false),
      link: text("link", RULES.notify_link_chars, false),
    };
    notifies += 1;
    if (notifies > limits.notify_per_drive) {
      throw new LimitError(`notify per drive limit of ${limits.notify_per_drive} exceeded`);
    }
    return request("notify", "", op, valueAnswer);
  } catch (error) {
    return reject(error);
  }
}
// db.sql: a method (no `prototype`, not a constructor), as the step API's are.
const { sql: dbSql } = {
  sql(sql, params) {
    try {
      if (typeof sql !== "string" || sql.length === 0 || sql.length > RULES.sql_chars || !call(isWellFormed, sql)) {
        throw new RealTypeError(`db.sql needs well-formed SQL text of 1 to ${RULES.sql_chars} characters`);
      }
      const list = params === undefined ? [] : params;
      if (!isArray(list)) throw new RealTypeError("db.sql params must be an array");
      const op = { op: "db.sql", sql, params: encode(list, "the params of db.sql") };
      return request("sql", "", op, valueAnswer);
    } catch (error) {
      return reject(error);
    }
  },
};

// console output: captured per run, each line stored once. Lines are numbered within the
// scope that prints them (the workflow body, or one attempt of a step body): the workflow
// body runs again on every drive and skips the lines an earlier drive stored; an attempt's
// body runs once, so its lines are new. Every call counts against the per-drive line limit.
function logger(level) {
  return (...args) => {
    const scope = currentScope;
    scope.logs += 1;
    if (scope === ROOT_SCOPE && scope.logs <= logsSeen) return; // stored by an earlier drive
    logCount += 1;
    if (logCount > limits.log_lines_per_drive) {
      if (logCount === limits.log_lines_per_drive + 1) {
        const text = `[console: more than ${limits.log_lines_per_drive} lines in one drive; the rest were dropped]`;
        send({ op: "log", level: "warn", text, count: scope.logs, source: scopeId(scope) }, null);
      }
      return;
    }
    let text = "";
    for (let i = 0; i < args.length; i++) {
      const arg = args[i];
      let part;
      if (typeof arg === "string") part = arg;
      else if (secretNames.has(arg)) part = `[secret ${secretNames.get(arg)}]`;
      else if (arg !== null && typeof arg === "object") {
        try {
          part = stringify(arg);
        } catch {
          part = "[unprintable]";
        }
        if (typeof part !== "string") part = "[unprintable]";
      } else part = typeof arg === "bigint" || typeof arg === "symbol" ? "[" + typeof arg + "]" : "" + arg;
      text += (i ? " " : "") + part;
      if (text.length > RULES.log_line_chars) break;
    }
    text = wellFormed(call(strSlice, text, 0, RULES.log_line_chars));
    logBytes += text.length;
    if (logBytes > limits.log_bytes_per_drive) return;
    send({ op: "log", level, text, count: scope.logs, source: scopeId(scope) }, null);
  };
}
