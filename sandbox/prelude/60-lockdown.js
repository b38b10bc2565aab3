// Lockdown: determinism installed, intrinsics frozen, the runtime defined.

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
//
// The walk looks at every property of every object it reaches (about a thousand), most of them
// plain methods; it returns its plan, the route to each object it froze. Every fresh context of
// this prelude has the same shape: the executor compiles the first context's routes into a
// function, `planned`, added to the prelude as a part of its own (sandbox/lockdown_plan.py),
// which the next contexts call instead of walking. A route is [0, root], [1, object] (its
// prototype) or [2, object, key, symbol?], objects numbered in the order they were frozen. A
// route that does not lead to an object (a context of another shape) stops `planned`, and the
// walk freezes the rest. Returns null when `planned` froze everything.
/** @type {null | ((roots: unknown[], take: (object: unknown) => unknown) => void)} */
let planned = null;
const OFF_PLAN = freeze({});
function takePlanned(object) {
  if (object === null || object === G || (typeof object !== "object" && typeof object !== "function")) {
    throw OFF_PLAN;
  }
  freeze(object);
  return object;
}
function harden(roots) {
  if (planned !== null) {
    try {
      planned(roots, takePlanned);
      return null;
    } catch (error) {
      if (error !== OFF_PLAN) throw error;
    }
  }
  const seen = new RealSet();
  const routes = [];
  const queue = [];
  for (let i = 0; i < roots.length; i++) append(queue, [roots[i], [0, i]]);
  while (queue.length) {
    const [object, route] = queue.pop();
    if (object === null || (typeof object !== "object" && typeof object !== "function")) continue;
    if (seen.has(object) || object === G) continue;
    seen.add(object);
    freeze(object);
    const at = routes.length;
    append(routes, route);
    append(queue, [getPrototypeOf(object), [1, at]]);
    const names = ownKeys(object);
    for (let i = 0; i < names.length; i++) {
      const desc = getOwnPropertyDescriptor(object, names[i]);
      const value = desc.value;
      if ((value !== null && typeof value === "object") ||
          (typeof value === "function" && hasOwn(value, "prototype"))) {
        append(queue, [value, keyRoute(at, names[i])]);
      }
    }
  }
  return routes;
}
function keyRoute(at, name) {
  if (typeof name !== "symbol") return [2, at, name];
  const description = name.description || "";
  const known = call(strSlice, description, 7); // "Symbol.iterator" -> "iterator"
  return RealSymbol[known] === name ? [2, at, known, 1] : [3]; // [3]: no route, walk each time
}
// The step scope follows awaits: a callback registered with then() (which is what every
// compiled await uses, see bundles/driver.mjs) runs in the scope that registered it, so code
// in a step body stays in that body after awaiting anything at all.
// (A method, as the engine's own `then` is: no `prototype`, not a constructor.)
const { then } = {
  then(onFulfilled, onRejected) {
    if (unawaitedCount > 0) {
      const awaiting = unawaited.get(this);
      if (awaiting !== undefined) {
        awaiting.awaited = true;
        unawaited.delete(this);
        unawaitedCount -= 1;
      }
    }
    const scope = currentScope;
    return call(promiseThen, this, inScope(scope, onFulfilled), inScope(scope, onRejected));
  },
};
function inScope(scope, callback) {
  if (typeof callback !== "function") return callback;
  return (value) => {
    const saved = currentScope;
    currentScope = scope;
    try {
      return callback(value);
    } finally {
      currentScope = saved;
    }
  };
}
function lockdown(runtime) {
  defineProperty(P.prototype, "then", { value: then, writable: true, configurable: true, enumerable: false });
  for (const name of ["WeakRef", "FinalizationRegistry", "performance", "SharedArrayBuffer", "Atomics"]) {
    delete G[name];
  }
  G.Date = /** @type {DateConstructor} */ (/** @type {unknown} */ (LogicalDate));
  Math.random = random;
  /** @type {Array<[object, string[]]>} */
  const overrides = [
    [O.prototype, ["constructor", "toString", "toLocaleString", "valueOf", "hasOwnProperty", "isPrototypeOf", "propertyIsEnumerable"]],
    [Function.prototype, ["constructor", "toString"]],
    [Array.prototype, ["constructor", "toString"]],
    // Buffer polyfills (nodejs_compat) set their own methods of these names on a Uint8Array
    // subclass's prototype.
    [O.getPrototypeOf(Uint8Array.prototype), ["constructor", "toString", "toLocaleString", "fill",
      "includes", "indexOf", "lastIndexOf", "slice"]],
  ];
  for (const errorClass of [RealError, RealTypeError, RangeError, SyntaxError, ReferenceError, EvalError, URIError, AggregateError, InternalError]) {
    append(overrides, [errorClass.prototype, ["constructor", "name", "message", "toString"]]);
  }
  // Indexed (a `for of` makes an iterator for every list, and one more to destructure each pair).
  for (let i = 0; i < overrides.length; i++) {
    const names = overrides[i][1];
    for (let j = 0; j < names.length; j++) enableOverride(overrides[i][0], names[j]);
  }
  defineProperty(G, "console", {
    value: { log: logger("log"), info: logger("info"), warn: logger("warn"), error: logger("error"), debug: logger("log") },
    writable: false, configurable: false, enumerable: false,
  });
  defineProperty(G, "__qjsflow", { value: runtime, writable: false, configurable: false, enumerable: false });
  // The Web APIs the prelude provides (55-fetch, 57-timers, 58-web), fixed on the global.
  /** @type {Record<string, unknown>} */
  const web = {
    fetch: fetchFunction, Headers, Request, Response, crypto: webCrypto, TextEncoder, TextDecoder,
    URL, URLSearchParams, setTimeout: timerFunctions.setTimeout, setInterval: timerFunctions.setInterval,
    clearTimeout: timerFunctions.clearTimeout, clearInterval: timerFunctions.clearInterval,
  };
  const webNames = objectKeys(web);
  for (let i = 0; i < webNames.length; i++) {
    defineProperty(G, webNames[i], { value: web[webNames[i]], writable: false, configurable: false, enumerable: false });
  }
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
  return harden(roots);
}
