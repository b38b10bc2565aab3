// The tagged value encoding: JS values to ASCII JSON text and back.

// ---- the tagged value encoding ------------------------------------------------------------

function describeKind(value) {
  return typeof value === "function" ? "a function" : "a symbol";
}

// ---- secrets: opaque handles -----------------------------------------------------------------
// The sandbox never holds a secret's value: `env.API_KEY` is a handle that prints as
// "[secret API_KEY]", refuses JSON, and may only be passed to a tool (the host puts the value
// in, host-side). Step results, logs and the run's output refuse it.
const secretNames = new RealWeakMap();
const SECRET_PROTO = freeze(createObject(null, {
  toString: { value() { return `[secret ${secretNames.get(this)}]`; } },
  toJSON: { value() { throw new RealTypeError(`the secret ${secretNames.get(this)} cannot be turned into JSON`); } },
  [RealSymbol.toPrimitive]: { value() { return `[secret ${secretNames.get(this)}]`; } },
}));
function secretHandle(name) {
  const handle = freeze(createObject(SECRET_PROTO));
  secretNames.set(handle, name);
  return handle;
}

// The encoder's functions take the encoding's state (not closures over it, made anew for
// every value encoded: a step's result is encoded once, and each closure was an allocation).
// `where` names the value in a refusal: a text, or a function that makes it (only then).
function encode(value, where, secrets) {
  const state = { ancestors: [], where, secrets, budget: limits.value_bytes };
  const text = asciiJSON(encodeIn(state, value, 1));
  if (text.length > state.budget) refuseIn(state, `is larger than the limit of ${state.budget} bytes`);
  return text;
}
function refuseIn(state, problem) {
  const where = typeof state.where === "function" ? state.where() : state.where;
  throw new LimitError(where + " " + problem);
}
function encodeIn(state, v, depth) {
  if (depth > limits.value_depth) refuseIn(state, `is nested deeper than ${limits.value_depth} levels`);
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
      return refuseIn(state, `holds ${describeKind(v)}, which cannot be stored`);
  }
  if (v === null) return null;
  const secret = secretNames.get(v);
  if (secret !== undefined) {
    // To a tool, the host puts the value in; in a step's result, the handle is what is
    // recorded (its name, never the value) and a replay gets the same handle back.
    if (state.secrets !== "pass to the host" && state.secrets !== "keep the handle") {
      refuseIn(state, `holds the secret ${secret}, which can only be passed to a tool`);
    }
    return { $t: "secret", v: secret };
  }
  const ancestors = state.ancestors;
  for (let i = 0; i < ancestors.length; i++) {
    if (ancestors[i] === v) refuseIn(state, "holds a cycle, which cannot be stored");
  }
  // No finally: a value that throws ends its whole encoding, this state with it.
  append(ancestors, v);
  const out = encodeObject(state, v, depth);
  ancestors.length -= 1;
  return out;
}
function encodeObject(state, v, depth) {
  const budget = state.budget;
  if (isArray(v)) {
    const length = v.length;
    if (length > budget) refuseIn(state, `is larger than the limit of ${budget} bytes`);
    const out = [];
    for (let i = 0; i < length; i++) append(out, encodeIn(state, v[i], depth + 1));
    return out;
  }
  // An object made by `{}` (its prototype the frozen Object.prototype, most results of a step)
  // skips the brand checks for values that are stored (each throws for it: six errors made and
  // caught an object, ~7 % of a pure step's work); only those that refuse the value are made.
  // Such an object is plain whatever its slots (a Date given Object.prototype is one); a view
  // or a promise given it is still refused below.
  if (getPrototypeOf(v) === O.prototype && !isView(v) && brand(promiseIs, v) === NOT) {
    return encodePlain(state, v, depth);
  }
  const time = brand(dateGetTime, v);
  if (time !== NOT) return { $t: "Date", v: time === time ? time : null };
  if (brand(mapSize, v) !== NOT) {
    const out = [];
    const it = call(mapEntries, v);
    for (let step = iteratorNext(it); !step.done; step = iteratorNext(it)) {
      append(out, [encodeIn(state, step.value[0], depth + 2), encodeIn(state, step.value[1], depth + 2)]);
    }
    return { $t: "Map", v: out };
  }
  if (brand(setSize, v) !== NOT) {
    const out = [];
    const it = call(setValues, v);
    for (let step = iteratorNext(it); !step.done; step = iteratorNext(it)) {
      append(out, encodeIn(state, step.value, depth + 1));
    }
    return { $t: "Set", v: out };
  }
  const tag = isView(v) ? brand(typedArrayTag, v) : NOT;
  if (tag !== NOT) {
    if (tag === undefined) refuseIn(state, "holds a DataView, which cannot be stored");
    const length = call(typedArrayByteLength, v);
    if (2 * length > budget) refuseIn(state, `is larger than the limit of ${budget} bytes`);
    const bytes = new RealUint8Array(call(typedArrayBuffer, v), call(typedArrayOffset, v), length);
    return { $t: tag, v: toHex(bytes) };
  }
  const bufferLength = brand(arrayBufferByteLength, v);
  if (bufferLength !== NOT) {
    if (2 * bufferLength > budget) refuseIn(state, `is larger than the limit of ${budget} bytes`);
    return { $t: "ArrayBuffer", v: toHex(new RealUint8Array(v)) };
  }
  const source = brand(regexpSource, v);
  if (source !== NOT) return { $t: "RegExp", v: source, flags: call(regexpFlags, v) };
  if (brand(promiseIs, v) !== NOT) {
    refuseIn(state, "holds a Promise; await it before returning");
  }
  if (v instanceof RealError) {
    return { $t: "Error", name: safeString(v, "name", "Error"), message: safeString(v, "message", "") };
  }
  return encodePlain(state, v, depth);
}
// An object's own enumerable properties, onto an object with no prototype (where even
// "__proto__" is a plain property).
function encodePlain(state, v, depth) {
  const out = createObject(null);
  const names = objectKeys(v);
  for (let i = 0; i < names.length; i++) {
    if (!call(isWellFormed, names[i])) refuseIn(state, "has a property name with a lone surrogate");
    out[names[i]] = encodeIn(state, v[names[i]], depth + 1);
  }
  return hasOwn(out, "$t") ? { $t: "object", v: out } : out;
}

const NOT = {};
// Called with the value as `this`, like the getters above: only a real promise passes.
function promiseIs() {
  call(promiseThen, this, undefined, undefined);
  return true;
}
// A failing brand check throws a TypeError, whose stack trace the engine writes out first (~3
// µs at an encoder's depth, six times for every plain object a step returns): checked with
// no trace, the author's own setting put back after.
function brand(fn, value) {
  const limit = RealError.stackTraceLimit;
  RealError.stackTraceLimit = 0;
  try {
    return call(fn, value);
  } catch {
    return NOT;
  } finally {
    RealError.stackTraceLimit = limit;
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

// Revived in place: the arrays and objects JSON.parse made are this decoding's alone, plain
// and writable, with every key an own data property (even "__proto__"), so each tagged value
// is put where it was instead of every container being copied.
function decode(text) {
  return revive(parseJSON(text));
}
function revive(v) {
  if (v === null || typeof v !== "object") return v;
  if (isArray(v)) {
    for (let i = 0; i < v.length; i++) {
      const item = v[i];
      if (item !== null && typeof item === "object") v[i] = revive(item);
    }
    return v;
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
    case "secret": return secretHandle(v.v);
    case "binding": return bindingObject(v.kind, v.v);
  }
  if (hasOwn(TYPED, v.$t)) {
    const bytes = fromHex(v.v);
    return new TYPED[v.$t](bytes.buffer, 0, bytes.length / TYPED[v.$t].BYTES_PER_ELEMENT);
  }
  throw new DriveError("the journal holds a value with an unknown tag: " + v.$t);
}
function plainObject(v) {
  const names = objectKeys(v);
  for (let i = 0; i < names.length; i++) {
    const item = v[names[i]];
    if (item !== null && typeof item === "object") v[names[i]] = revive(item);
  }
  return v;
}
