// fetch, Headers and Response: a fetch is a journaled host call (runner/tenancy/egress.py does it
// under the scope's egress policy), so a replayed step never fetches again.

const FETCH_ADDRESS = "qjsflow.fetch";
// The name/value lists behind Headers and URLSearchParams: one shape, kept out of reach.
const pairLists = new RealWeakMap(); // PairList -> [[name, value], ...]
class PairList {
  constructor() {
    pairLists.set(this, []);
  }
  _key(name) {
    return "" + name;
  }
  append(name, value) {
    append(pairLists.get(this), [this._key(name), value]);
    this._changed();
  }
  set(name, value) {
    this.delete(name);
    this.append(name, value);
  }
  delete(name) {
    const key = this._key(name);
    const kept = [];
    const list = pairLists.get(this);
    for (let i = 0; i < list.length; i++) if (list[i][0] !== key) append(kept, list[i]);
    pairLists.set(this, kept);
    this._changed();
  }
  getAll(name) {
    const key = this._key(name);
    const values = [];
    const list = pairLists.get(this);
    for (let i = 0; i < list.length; i++) if (list[i][0] === key) append(values, list[i][1]);
    return values;
  }
  has(name) {
    return this.getAll(name).length > 0;
  }
  forEach(callback) {
    const list = pairLists.get(this);
    for (let i = 0; i < list.length; i++) callback(list[i][1], list[i][0], this);
  }
  entries() {
    return pairLists.get(this).slice()[RealSymbol.iterator]();
  }
  [RealSymbol.iterator]() {
    return this.entries();
  }
  _changed() {}
}

class Headers extends PairList {
  constructor(init) {
    super();
    const pairs = headerPairs(init);
    for (let i = 0; i < pairs.length; i++) this.append(pairs[i][0], pairs[i][1]);
  }
  _key(name) {
    return call(strToLower, "" + name);
  }
  get(name) {
    const values = this.getAll(name);
    return values.length === 0 ? null : values.map((value) => "" + value).join(", ");
  }
}

// Header pairs from what fetch accepts: Headers, an array of pairs, or an object. Values
// stay as they are, so a secret handle reaches the host as a handle.
function headerPairs(init) {
  if (init === undefined || init === null) return [];
  if (pairLists.has(init)) return pairLists.get(init).slice();
  if (isArray(init)) {
    const pairs = [];
    for (let i = 0; i < init.length; i++) append(pairs, ["" + init[i][0], init[i][1]]);
    return pairs;
  }
  const names = objectKeys(init);
  const pairs = [];
  for (let i = 0; i < names.length; i++) append(pairs, [names[i], init[names[i]]]);
  return pairs;
}

class Request {
  constructor(input, init) {
    const base = input instanceof Request ? input : null;
    const options = init === undefined || init === null ? {} : init;
    this.url = base !== null ? base.url : "" + input;
    this.method = call(strToUpper, "" + (options.method !== undefined ? options.method : base !== null ? base.method : "GET"));
    this.headers = new Headers(options.headers !== undefined ? options.headers : base !== null ? base.headers : undefined);
    this.body = options.body !== undefined ? options.body : base !== null ? base.body : null;
  }
}

class Response {
  constructor(body, init) {
    const options = init === undefined ? {} : init;
    this.status = options.status === undefined ? 200 : options.status;
    this.statusText = options.statusText === undefined ? "" : options.statusText;
    this.ok = this.status >= 200 && this.status < 300;
    this.headers = new Headers(options.headers);
    this.url = options.url === undefined ? "" : options.url;
    this.redirected = options.redirected === true;
    this.bodyUsed = false;
    responseBodies.set(this, { text: body === undefined || body === null ? "" : "" + body, base64: options.base64 === true });
  }
  text() {
    const body = takeBody(this);
    return P.resolve(body.base64 ? atob(body.text) : body.text);
  }
  json() {
    return call(promiseThen, this.text(), (text) => parseJSON(text));
  }
  static json(data, init) {
    const options = init === undefined ? {} : init;
    const headers = new Headers(options.headers);
    if (!headers.has("content-type")) headers.set("content-type", "application/json");
    return new Response(stringify(data), { ...options, headers });
  }
  arrayBuffer() {
    const body = takeBody(this);
    const bytes = body.base64 ? atob(body.text) : unescape(encodeURIComponent(body.text));
    const out = new RealUint8Array(bytes.length);
    for (let i = 0; i < bytes.length; i++) out[i] = bytes.charCodeAt(i);
    return P.resolve(out.buffer);
  }
}
const responseBodies = new RealWeakMap();
function takeBody(response) {
  if (response.bodyUsed) throw new RealTypeError("the response body was already read");
  response.bodyUsed = true;
  return responseBodies.get(response);
}

// A plain method, as the Web's fetch is (no `prototype`: `new fetch()` is a TypeError).
const { fetch: fetchFunction } = {
  fetch(input, init) {
    try {
      const request = new Request(input instanceof Request ? input : typeof input === "string" ? input : input !== null && typeof input === "object" && typeof input.url === "string" ? input.url : "" + input, init);
      const url = request.url;
      const options = { method: request.method, headers: request.headers, body: request.body };
      const body = options.body === undefined || options.body === null ? null : options.body;
      if (body !== null && typeof body !== "string") {
        throw new RealTypeError("fetch: give the body as a string (JSON.stringify an object)");
      }
      const args = { url, method: options.method === undefined ? "GET" : "" + options.method, headers: headerPairs(options.headers), body };
      return call(promiseThen, stepTool("fetch", FETCH_ADDRESS, args, FETCH_CONFIG), (answer) =>
        new Response(answer.body, {
          status: answer.status, statusText: answer.statusText, headers: answer.headers, url: answer.url,
          redirected: answer.redirected, base64: answer.bodyEncoding === "base64",
        }));
    } catch (error) {
      return reject(error);
    }
  },
};
// A fetch is one call: a step around it retries it (and a failed one runs again in the step's
// next attempt).
const FETCH_CONFIG = freeze({ retries: freeze({ limit: 0 }) });

// ---- binding objects: env.KV and env.QUEUE ---------------------------------------------------
// Each method is a journaled tool call (the host keeps a KV namespace and a queue per scope in
// its journal, or calls the operator's own tools at these addresses).
const KV_ADDRESS = "qjsflow.kv";
const QUEUE_ADDRESS = "qjsflow.queue";
function bindingObject(kind, name) {
  const use = (address, op, args) => stepTool(`${name}.${op}`, address, { binding: name, op, ...args });
  const keyed = (address) => ({ // what a KV namespace and an R2 bucket have alike
    delete(key) {
      return call(promiseThen, use(address, "delete", { key }), () => undefined);
    },
    list(options) {
      const given = options === undefined || options === null ? {} : options;
      const prefix = given.prefix === undefined ? "" : "" + given.prefix;
      return use(address, "list", { prefix, limit: given.limit === undefined ? 1000 : given.limit });
    },
  });
  if (kind === "kv") {
    return freeze({
      get(key, type) {
        const asked = typeof type === "object" && type !== null ? type.type : type;
        return call(promiseThen, use(KV_ADDRESS, "get", { key }), (value) =>
          value !== null && asked === "json" ? parseJSON(value) : value);
      },
      put(key, value) {
        if (typeof value !== "string") return reject(new RealTypeError(`${name}.put takes a string value`));
        return call(promiseThen, use(KV_ADDRESS, "put", { key, value }), () => undefined);
      },
      ...keyed(KV_ADDRESS),
    });
  }
  if (kind === "queue") {
    return freeze({
      send(body) {
        return call(promiseThen, use(QUEUE_ADDRESS, "send", { bodies: [body] }), () => undefined);
      },
      sendBatch(messages) {
        const bodies = [];
        for (let i = 0; i < messages.length; i++) append(bodies, messages[i].body);
        return call(promiseThen, use(QUEUE_ADDRESS, "send", { bodies }), () => undefined);
      },
    });
  }
  if (kind === "r2") {
    const object = (key, text) => text === null ? null : freeze({
      key, size: text.length,
      text: () => P.resolve(text),
      json: () => P.resolve(parseJSON(text)),
    });
    return freeze({
      get(key) {
        return call(promiseThen, use(R2_ADDRESS, "get", { key }), (text) => object(key, text));
      },
      head(key) {
        return call(promiseThen, use(R2_ADDRESS, "head", { key }), (text) => object(key, text));
      },
      put(key, value) {
        if (typeof value !== "string") return reject(new RealTypeError(`${name}.put takes a string value here`));
        return call(promiseThen, use(R2_ADDRESS, "put", { key, value }), () => object(key, value));
      },
      ...keyed(R2_ADDRESS),
    });
  }
  if (kind === "durable_object") {
    // Stubs whose every method is a call to the operator's `qjsflow.durable_object` tool.
    const stub = (id) => new RealProxy(freeze({ id }), {
      get(target, method) {
        if (typeof method !== "string" || method === "then") return undefined;
        if (method === "id") return target.id;
        return (...args) => use(DURABLE_OBJECT_ADDRESS, method, { id: target.id, args });
      },
    });
    return freeze({
      idFromName: (objectName) => freeze({ name: "" + objectName, toString: () => "" + objectName }),
      get: (id) => stub(typeof id === "object" && id !== null ? id.name : "" + id),
      getByName: (objectName) => stub("" + objectName),
    });
  }
  if (kind === "workflow") {
    // A workflow binding (Cloudflare's Workflow API): every method is a journaled call to the
    // host's `qjsflow.workflow`, so a replay creates no second instance.
    const done = () => undefined;
    const instance = (id) => freeze({
      id,
      status: () => use(WORKFLOW_ADDRESS, "status", { id }),
      pause: () => call(promiseThen, use(WORKFLOW_ADDRESS, "pause", { id }), done),
      resume: () => call(promiseThen, use(WORKFLOW_ADDRESS, "resume", { id }), done),
      terminate: () => call(promiseThen, use(WORKFLOW_ADDRESS, "terminate", { id }), done),
      restart: () => call(promiseThen, use(WORKFLOW_ADDRESS, "restart", { id }), done),
      sendEvent: (event) => call(promiseThen, use(WORKFLOW_ADDRESS, "sendEvent", {
        id, type: event === null || typeof event !== "object" ? undefined : event.type,
        payload: event === null || typeof event !== "object" ? undefined : event.payload,
      }), done),
    });
    const options = (given) => given === undefined || given === null ? {}
      : { id: given.id === undefined ? null : given.id, params: given.params === undefined ? null : given.params };
    return freeze({
      create: (given) => call(promiseThen, use(WORKFLOW_ADDRESS, "create", options(given)), (made) => instance(made.id)),
      createBatch: (list) => {
        const items = [];
        for (let i = 0; i < list.length; i++) append(items, options(list[i]));
        return call(promiseThen, use(WORKFLOW_ADDRESS, "createBatch", { items }), (made) => {
          const out = [];
          for (let i = 0; i < made.length; i++) append(out, instance(made[i].id));
          return out;
        });
      },
      get: (id) => call(promiseThen, use(WORKFLOW_ADDRESS, "get", { id: "" + id }), (found) => instance(found.id)),
    });
  }
  if (kind === "tool") {
    // Every method is a call to the operator's tool `NAME.method`, given the arguments' list.
    return new RealProxy(freeze({}), {
      get(_, method) {
        if (typeof method !== "string" || method === "then" || method === "toJSON") return undefined;
        return (...args) => stepTool(`${name}.${method}`, `${name}.${method}`, args);
      },
    });
  }
  throw new DriveError(`unknown binding kind ${kind}`);
}
const R2_ADDRESS = "qjsflow.r2";
const DURABLE_OBJECT_ADDRESS = "qjsflow.durable_object";
const WORKFLOW_ADDRESS = "qjsflow.workflow";
