// The Web APIs Cloudflare code reaches for that QuickJS lacks: crypto (seeded like Math.random,
// so a replay sees the same values), TextEncoder/TextDecoder (UTF-8), URL and URLSearchParams.

const webCrypto = freeze({
  getRandomValues(array) {
    if (!ArrayBuffer.isView(array) || array instanceof Float32Array || array instanceof Float64Array) {
      throw new RealTypeError("crypto.getRandomValues takes an integer typed array");
    }
    if (array.byteLength > 65536) throw new RealTypeError("crypto.getRandomValues: at most 65536 bytes");
    const bytes = new RealUint8Array(array.buffer, array.byteOffset, array.byteLength);
    for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(random() * 256);
    return array;
  },
  randomUUID() {
    const bytes = webCrypto.getRandomValues(new RealUint8Array(16));
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    const hex = [];
    for (let i = 0; i < 16; i++) append(hex, call(strSlice, "0" + call(numToString, bytes[i], 16), -2));
    const h = hex.join("");
    return `${call(strSlice, h, 0, 8)}-${call(strSlice, h, 8, 12)}-${call(strSlice, h, 12, 16)}-${call(strSlice, h, 16, 20)}-${call(strSlice, h, 20)}`;
  },
});

class TextEncoder {
  get encoding() {
    return "utf-8";
  }
  encode(text) {
    const binary = unescape(encodeURIComponent(wellFormed(text === undefined ? "" : "" + text)));
    const out = new RealUint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
    return out;
  }
}
class TextDecoder {
  constructor(label) {
    const name = label === undefined ? "utf-8" : call(strToLower, "" + label);
    if (name !== "utf-8" && name !== "utf8") throw new RealTypeError(`TextDecoder: only utf-8, not ${name}`);
  }
  get encoding() {
    return "utf-8";
  }
  decode(input) {
    if (input === undefined) return "";
    const bytes = input instanceof RealArrayBuffer ? new RealUint8Array(input)
      : new RealUint8Array(input.buffer, input.byteOffset, input.byteLength);
    let binary = "";
    for (let i = 0; i < bytes.length; i++) binary += String.fromCharCode(bytes[i]);
    try {
      return decodeURIComponent(escape(binary));
    } catch {
      throw new RealTypeError("TextDecoder: the bytes are not valid UTF-8");
    }
  }
}

const formEncode = (text) => call(strReplace, encodeURIComponent(text), /%20/g, "+");
const formDecode = (text) => decodeURIComponent(call(strReplace, text, /\+/g, " "));
const paramOwners = new RealWeakMap(); // URLSearchParams -> the URL whose search it is
class URLSearchParams extends PairList {
  constructor(init) {
    super();
    if (init === undefined || init === null) return;
    if (typeof init === "string") {
      const text = call(strSlice, init, 0, 1) === "?" ? call(strSlice, init, 1) : init;
      const parts = text === "" ? [] : text.split("&");
      for (let i = 0; i < parts.length; i++) {
        if (parts[i] === "") continue;
        const at = call(strIndexOf, parts[i], "=");
        if (at < 0) this.append(formDecode(parts[i]), "");
        else this.append(formDecode(call(strSlice, parts[i], 0, at)), formDecode(call(strSlice, parts[i], at + 1)));
      }
    } else {
      const pairs = headerPairs(init);
      for (let i = 0; i < pairs.length; i++) this.append(pairs[i][0], "" + pairs[i][1]);
    }
  }
  append(name, value) {
    super.append(name, "" + value);
  }
  get(name) {
    const values = this.getAll(name);
    return values.length === 0 ? null : values[0];
  }
  get size() {
    return pairLists.get(this).length;
  }
  toString() {
    const parts = [];
    this.forEach((value, name) => append(parts, formEncode(name) + "=" + formEncode(value)));
    return parts.join("&");
  }
  _changed() {
    const owner = paramOwners.get(this);
    if (owner !== undefined) owner.search = this.toString();
  }
}

// URL: absolute http(s)-like URLs and paths relative to a base (what workflows build and
// fetch); special schemes' finer rules (IDNA, IPv6 zones, file:) are not modelled.
const URL_PATTERN = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/(?:([^@/?#]*)@)?([^/?#:]*|\[[^\]]*\])(?::(\d*))?([^?#]*)(\?[^#]*)?(#.*)?$/;
const DEFAULT_PORTS = { "http:": "80", "https:": "443", "ws:": "80", "wss:": "443" };
class URL {
  constructor(input, base) {
    let text = "" + input;
    if (base !== undefined && !call(strTest, URL_PATTERN, text)) text = resolveUrl(text, new URL(base));
    const match = call(regexpExec, URL_PATTERN, text);
    if (match === null) throw new RealTypeError(`Invalid URL: ${call(strSlice, text, 0, 200)}`);
    this.protocol = call(strToLower, match[1]) + ":";
    const credentials = match[2] === undefined ? "" : match[2];
    const colon = call(strIndexOf, credentials, ":");
    this.username = colon < 0 ? credentials : call(strSlice, credentials, 0, colon);
    this.password = colon < 0 ? "" : call(strSlice, credentials, colon + 1);
    this.hostname = call(strToLower, match[3]);
    const port = match[4] === undefined ? "" : match[4];
    this.port = DEFAULT_PORTS[this.protocol] === port ? "" : port;
    this.pathname = normalizePath(match[5] === "" ? "/" : match[5]);
    this.hash = match[7] === undefined || match[7] === "#" ? "" : match[7];
    this._search = match[6] === undefined || match[6] === "?" ? "" : match[6];
    const params = new URLSearchParams(this._search);
    paramOwners.set(params, this);
    this.searchParams = params;
  }
  get search() {
    return this._search;
  }
  set search(value) {
    const text = "" + value;
    this._search = text === "" || text === "?" ? "" : call(strSlice, text, 0, 1) === "?" ? text : "?" + text;
  }
  get host() {
    return this.port === "" ? this.hostname : `${this.hostname}:${this.port}`;
  }
  get origin() {
    return `${this.protocol}//${this.host}`;
  }
  get href() {
    const credentials = this.username === "" ? "" : this.password === "" ? `${this.username}@` : `${this.username}:${this.password}@`;
    return `${this.protocol}//${credentials}${this.host}${this.pathname}${this.search}${this.hash}`;
  }
  toString() {
    return this.href;
  }
  toJSON() {
    return this.href;
  }
  static canParse(input, base) {
    try {
      new URL(input, base);
      return true;
    } catch {
      return false;
    }
  }
}
function resolveUrl(relative, base) {
  if (call(strSlice, relative, 0, 2) === "//") return base.protocol + relative;
  if (call(strSlice, relative, 0, 1) === "/") return base.origin + relative;
  if (call(strSlice, relative, 0, 1) === "?") return base.origin + base.pathname + relative;
  if (call(strSlice, relative, 0, 1) === "#") return base.origin + base.pathname + base.search + relative;
  const folder = call(strSlice, base.pathname, 0, base.pathname.lastIndexOf("/") + 1);
  return base.origin + folder + relative;
}
function normalizePath(path) {
  const out = [];
  const parts = path.split("/");
  for (let i = 1; i < parts.length; i++) {
    if (parts[i] === "..") {
      if (out.length) out.length -= 1;
      if (i === parts.length - 1) append(out, "");
    } else if (parts[i] === ".") {
      if (i === parts.length - 1) append(out, "");
    } else append(out, parts[i]);
  }
  return "/" + out.join("/");
}
