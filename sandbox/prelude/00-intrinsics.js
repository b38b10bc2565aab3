// Intrinsics captured before any author code runs, and helpers that use only those.

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
const RealWeakMap = WeakMap;
const RealProxy = Proxy;
const RealBigInt = BigInt;
const RealUint8Array = Uint8Array;
const RealArrayBuffer = ArrayBuffer;
const RealRegExp = RegExp;
const RealSymbol = Symbol;
const strRepeat = String.prototype.repeat;
const fnToString = Function.prototype.toString;
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
const strIndexOf = String.prototype.indexOf;
const strToLower = String.prototype.toLowerCase;
const strToUpper = String.prototype.toUpperCase;
const regexpExec = RegExp.prototype.exec;
const arrayIndexOf = Array.prototype.indexOf;
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

// `call(fn, self, a, b)` is `fn.call(self, a, b)` through the intrinsic, bound once: no array
// of arguments made for every call, as a rest parameter would (a step makes dozens of calls).
const fnCall = Function.prototype.call;
const call = fnCall.bind(fnCall);
const append = (list, item) => {
  list[list.length] = item;
};
const NON_ASCII = /[\u007f-\uffff]/g;
// Looked for once before replacing: most texts have none, and a replace by a global regex
// costs several times a search. (Not `^[...]*$`, which reads ASCII text a little faster: its
// greedy loop keeps a place to go back to for every character, and a text of a megabyte ran
// the engine's regex memory out.)
const ANY_NON_ASCII = /[\u007f-\uffff]/;
const hex4 = (code) => call(strSlice, "0000" + call(numToString, code, 16), -4);
const escapeChar = (c) => "\\u" + hex4(call(strCharCodeAt, c, 0));
// JSON.stringify escapes control characters and lone surrogates; this escapes the rest.
function asciiJSON(value) {
  const text = stringify(value);
  return call(strTest, ANY_NON_ASCII, text) ? call(strReplace, text, NON_ASCII, escapeChar) : text;
}
const CONTROL = /[\u0000-\u001f\u007f]/;
const fromCharCode = String.fromCharCode;
// Text for the host (logs, notifications, SQL) must be well-formed to parse as strict JSON.
const wellFormed = (text) => call(toWellFormed, text);

class LimitError extends RealError {}
class DriveError extends RealError {}
