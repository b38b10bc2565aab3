// Bundles the entries of one snapshot tree with esbuild's JS API, confined to that tree.
//
// Input (stdin, JSON): { esbuild, root, entries: [relative path], shims: {module: source},
//   files: {relative path: size}, refused: {relative path: why}, maxFiles, maxTotalBytes,
//   maxOutputBytes }. `files` and `refused` come from the publisher's scan of the tree.
// Output (stdout, JSON): { outputs: [{ entry, code, map }], inputs: {relative path: sha256} } or
//   { errors: [{ text, file, line, column }] }.
//
// Only what the entries reach is read, and this plugin reads it (esbuild never opens a file):
// each load must be a regular file the scan listed, opened without following a link. Relative
// imports may not leave the tree; a bare import resolves only in a node_modules folder inside
// the tree (esbuild's resolver, so `exports` maps work as in Node), never in one above it.
import { closeSync, constants, existsSync, fstatSync, openSync, readSync, realpathSync } from "node:fs";
import { readFileSync } from "node:fs";
import { createHash } from "node:crypto";
import { builtinModules, createRequire } from "node:module";
import { dirname, isAbsolute, relative, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

const request = JSON.parse(readFileSync(0, "utf8"));
const esbuild = createRequire(import.meta.url)(request.esbuild);
const root = realpathSync(request.root);
const shims = request.shims;
// With Cloudflare's nodejs_compat flag: the node_modules folder of the pinned polyfills
// (bundles/toolchain.py, NODE_COMPAT_PACKAGES); null without the flag.
const compat = request.nodeCompat ? realpathSync(request.nodeCompat) : null;
const COMPAT = "qjsflow-compat";
const NODE_GLOBALS = resolve(dirname(fileURLToPath(import.meta.url)), "shims", "node-globals.mjs");
const NODE_DENIED = "qjsflow-node-denied";
// What the sandbox must not give, whatever the flag: a file system, sockets, processes,
// threads. These modules load, and each call of theirs throws naming it. (The rest come from
// unenv, whose modules with no meaning here — tty, vm, v8 — are its own inert stand-ins.)
const DENIED = new Set([
  "fs", "fs/promises", "net", "tls", "dgram", "http", "https", "http2", "child_process", "cluster",
  "worker_threads", "dns", "dns/promises",
]);
// Where npm's packages stand in for unenv's (module -> file under the polyfills' node_modules).
const NPM_INSTEAD = { events: "events/events.js", buffer: "buffer/index.js" };
const files = request.files;
const refused = request.refused;
const links = request.links;
const VIRTUAL = "qjsflow-virtual";
// Imports that cannot be resolved here (a module only a Worker's own build provides, such as
// "virtual:react-router/server-build"; a Cloudflare module qjsflow has no equivalent of; a
// package not installed) load as a stub that throws on use, naming the module, and the publish
// says so. A package not installed that the bundle still refers to is refused (an `npm install`
// forgotten), as is everything that would reach outside the tree.
const MISSING = "qjsflow-missing";
const missing = new Map(); // specifier -> { importer, why }
const refuseMissing = new Set(); // specifiers refused on a second build (see bundle())
const BUILTINS = new Set(builtinModules);
const LOADERS = {
  ".ts": "ts", ".mts": "ts", ".cts": "ts", ".js": "js", ".mjs": "js", ".cjs": "js",
  ".json": "json", ".txt": "text",
};

const inside = (target) => target === root || target.startsWith(root + sep);
const treePath = (absolute) => relative(root, absolute).split(sep).join("/");
const refuse = (text) => ({ errors: [{ text }] });
const inputs = {};
let inputBytes = 0;

function whyNot(path) {
  const parts = path.split("/");
  for (let depth = parts.length; depth > 0; depth--) {
    const reason = refused[parts.slice(0, depth).join("/")];
    if (reason !== undefined) return reason;
  }
  return "is not in the published tree";
}

// Why an import that esbuild resolved out of the tree did so: the refused entry (a symlink,
// most likely) on its way, tried with each extension the resolver tries.
function refusedOnTheWay(lexical) {
  if (lexical === null || !inside(lexical)) return null;
  const path = treePath(lexical);
  for (const candidate of [path, ...[".ts", ".mts", ".js", ".mjs", ".cjs", ".json"].map((e) => path + e)]) {
    const reason = whyNot(candidate);
    if (!Object.hasOwn(files, candidate) && reason !== "is not in the published tree") {
      return `${candidate}: ${reason}`;
    }
  }
  return null;
}

// "zod", "zod/mini", "@scope/name/sub" -> the package name.
function packageName(specifier) {
  const parts = specifier.split("/");
  return specifier.startsWith("@") ? parts.slice(0, 2).join("/") : parts[0];
}

// The package a tree file belongs to, when it lies in a node_modules folder.
function owningPackage(path) {
  const at = path.lastIndexOf("node_modules/");
  return at < 0 ? null : packageName(path.slice(at + "node_modules/".length));
}

// Where a bare import's package is installed inside the tree: true, or why it is not usable
// (a refused link on the way), or false when no node_modules inside the tree has it.
function installedInTree(name, fromDir) {
  for (let dir = fromDir; inside(dir); dir = dirname(dir)) {
    const folder = treePath(resolve(dir, "node_modules", name));
    if (Object.hasOwn(files, `${folder}/package.json`) || Object.hasOwn(links, folder)) return true;
    const reason = whyNot(folder);
    if (reason !== "is not in the published tree") return `${folder}: ${reason}`;
    if (dir === root) break;
  }
  return false;
}

const guard = {
  name: "qjsflow-guard",
  setup(build) {
    build.onResolve({ filter: /.*/ }, async (args) => {
      if (args.pluginData === "inner") return undefined; // our own build.resolve below
      if (args.namespace === COMPAT) return compatImport(build, args);
      if (args.kind === "entry-point" && compat !== null && args.path === NODE_GLOBALS) {
        return { path: NODE_GLOBALS, namespace: COMPAT };
      }
      if (args.kind === "entry-point") {
        return inside(resolve(root, args.path)) ? undefined : refuse("entry outside the snapshot");
      }
      if (Object.hasOwn(shims, args.path)) return { path: args.path, namespace: VIRTUAL };
      if (args.namespace === VIRTUAL) return refuse(`the module "${args.importer}" imports nothing`);
      const importer = args.importer && inside(args.importer) ? treePath(args.importer) : "";
      if (isAbsolute(args.path)) {
        return refuse(`imports a file outside the snapshot: ${args.path} (absolute import)`);
      }
      const relativeImport = /^\.\.?(\/|$)/.test(args.path);
      if (relativeImport && !inside(resolve(args.resolveDir, args.path))) {
        return refuse(`imports a file outside the snapshot: ${args.path}`);
      }
      if (!relativeImport) {
        const name = packageName(args.path);
        const builtin = args.path.startsWith("node:") ? args.path.slice(5) : name;
        if (args.path.startsWith("node:") || BUILTINS.has(builtin)) {
          if (compat !== null) return nodeModule(args.path);
          const owner = owningPackage(importer);
          const who = owner === null ? "imports" : `imports (through the package "${owner}")`;
          return refuse(`${who} the Node built-in "${builtin}", which workflows have only with ` +
            `the nodejs_compat flag (compatibility_flags in the wrangler file)`);
        }
        if (/^[a-z][a-z0-9+.-]*:/i.test(args.path)) {
          const why = args.path.startsWith("cloudflare:")
            ? `qjsflow has no "${args.path}" (it has "cloudflare:workers" and "cloudflare:workflows")`
            : "a module only the project's own build provides";
          return leftOut(args.path, importer, why, true);
        }
        const installed = installedInTree(name, args.resolveDir);
        if (installed === false) {
          if (refuseMissing.has(args.path)) {
            return refuse(`imports the package "${name}", which is not installed: install it ` +
              `into node_modules inside the tree`);
          }
          return leftOut(args.path, importer, `the package "${name}" is not installed`, false);
        }
        if (installed !== true) return refuse(`imports the package "${name}": ${installed}`);
      }
      const found = await build.resolve(args.path, {
        kind: args.kind, importer: args.importer, resolveDir: args.resolveDir, pluginData: "inner",
      });
      if (found.errors.length > 0) return { errors: found.errors };
      if (found.external || found.namespace !== "file") return refuse(`cannot import ${args.path}`);
      if (!inside(found.path)) {
        const link = refusedOnTheWay(relativeImport ? resolve(args.resolveDir, args.path) : null);
        return refuse(link !== null ? link : `imports ${args.path}, which resolves outside the snapshot`);
      }
      return { path: found.path, sideEffects: found.sideEffects };
    });
    build.onLoad({ filter: /.*/, namespace: "file" }, (args) => load(args.path));
    build.onLoad({ filter: /.*/, namespace: COMPAT }, (args) => ({
      contents: readFileSync(args.path), loader: "js", resolveDir: dirname(args.path),
    }));
    build.onLoad({ filter: /.*/, namespace: NODE_DENIED }, (args) => ({
      contents: deniedModule(args.path), loader: "js",
    }));
    build.onLoad({ filter: /.*/, namespace: MISSING }, (args) => ({
      contents: stub(args.path, missing.get(args.path).why),
      loader: "js",
    }));
    build.onLoad({ filter: /.*/, namespace: VIRTUAL }, (args) => ({
      contents: shims[args.path],
      loader: "js",
    }));
  },
};

// A Node built-in under nodejs_compat: npm's package, unenv's module, or (what the sandbox
// must not give) a module whose calls throw.
function nodeModule(specifier) {
  const name = specifier.startsWith("node:") ? specifier.slice(5) : specifier;
  if (DENIED.has(name)) return { path: name, namespace: NODE_DENIED, sideEffects: false };
  if (Object.hasOwn(NPM_INSTEAD, name)) return { path: resolve(compat, NPM_INSTEAD[name]), namespace: COMPAT };
  const file = resolve(compat, "unenv", "dist", "runtime", "node", `${name}.mjs`);
  if (!file.startsWith(compat + sep) || !existsSync(file)) {
    return { path: name, namespace: NODE_DENIED, sideEffects: false };
  }
  return { path: file, namespace: COMPAT };
}

// The packages the polyfills import by name, and the file of each they use.
const COMPAT_PACKAGES = {
  pathe: "pathe/dist/index.mjs", "base64-js": "base64-js/index.js", ieee754: "ieee754/index.js",
};

// An import inside the polyfills: a built-in again, a package of theirs, or a file of theirs
// by its path (they name files with their extensions). Trusted (pinned and checked at
// install, never the author's), and resolved here: no resolver walks folders outside the tree.
function compatImport(build, args) {
  if (args.path.startsWith("node:") || BUILTINS.has(packageName(args.path))) return nodeModule(args.path);
  const file = Object.hasOwn(COMPAT_PACKAGES, args.path)
    ? resolve(compat, COMPAT_PACKAGES[args.path])
    : resolve(args.resolveDir, args.path);
  if (!file.startsWith(compat + sep) || !existsSync(file)) {
    return refuse(`the Node polyfills import ${args.path}, which is not among them`);
  }
  return { path: file, namespace: COMPAT };
}

// A module the sandbox must not give: it loads, and every call of it throws naming the call.
function deniedModule(name) {
  const message = JSON.stringify(`is not available in a workflow (node:${name}: no file system, ` +
    "sockets, processes or threads here)");
  return `var deny = function (what) { return function () { throw new Error("node:${name}." + what + " " + ${message}); }; };
var handler = {
  get: function (_, key) { if (key === "__esModule") return true; if (typeof key === "symbol") return undefined; return key === "default" ? module.exports : deny(String(key)); },
  has: function () { return false; }, ownKeys: function () { return []; },
};
var methods = new Proxy(function () {}.bind(null), handler);
handler.getPrototypeOf = function () { return methods; };
module.exports = new Proxy(function () {}.bind(null), handler);
`;
}

function leftOut(specifier, importer, why, scheme) {
  if (!missing.has(specifier)) missing.set(specifier, { importer, why, scheme });
  return { path: specifier, namespace: MISSING, sideEffects: false };
}

// A CommonJS module whose every use throws, naming the module: esbuild reads a named import
// of a CommonJS module through its prototype (the namespace object it makes inherits from
// the module's prototype when `__esModule` is set), so `import { x } from "m"` loads quietly
// and `x(...)` throws.
function stub(specifier, why) {
  const message = JSON.stringify(`the module "${specifier}" is not in this snapshot (${why}): ` +
    "the code that uses it cannot run in a workflow");
  return `var fail = function () { throw new Error(${message}); };
var handler = {
  get: function (_, key) { if (key === "__esModule") return true; if (typeof key === "symbol") return undefined; return fail(); },
  has: function () { return false; }, ownKeys: function () { return []; },
  apply: fail, construct: fail, set: fail,
};
var blocked = new Proxy(function () {}.bind(null), handler);
handler.getPrototypeOf = function () { return blocked; };
module.exports = new Proxy(function () {}.bind(null), handler);
`;
}

// Read one reached file: listed by the scan, inside the tree, a regular file opened without
// following a link; its digest lets the publisher check that it reads the same bytes.
function load(absolute) {
  if (!inside(absolute)) return refuse("imports a file outside the snapshot");
  const path = treePath(absolute);
  if (!Object.hasOwn(files, path)) return refuse(`${path}: ${whyNot(path)}`);
  const extension = path.slice(path.lastIndexOf("."));
  const loader = Object.hasOwn(LOADERS, extension) ? LOADERS[extension] : null;
  if (loader === null) return refuse(`${path}: files ending in "${extension}" cannot be imported`);
  let contents;
  if (!Object.hasOwn(inputs, path)) {
    if (Object.keys(inputs).length >= request.maxFiles) {
      return refuse(`the workflows reach more than ${request.maxFiles} files (at ${path})`);
    }
    contents = readListed(path);
    if (typeof contents === "string") return refuse(`${path}: ${contents}`);
    inputBytes += contents.length;
    if (inputBytes > request.maxTotalBytes) {
      return refuse(`the workflows reach more than ${request.maxTotalBytes} bytes in all (at ${path})`);
    }
    inputs[path] = createHash("sha256").update(contents).digest("hex");
  } else {
    contents = readListed(path);
    if (typeof contents === "string") return refuse(`${path}: ${contents}`);
  }
  return { contents, loader, resolveDir: dirname(absolute) };
}

function readListed(path) {
  let fd;
  try {
    fd = openSync(resolve(root, path), constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (error) {
    return error && error.code === "ELOOP" ? "is a symlink" : "cannot be opened";
  }
  try {
    const info = fstatSync(fd);
    if (!info.isFile()) return "is not a regular file";
    const limit = files[path];
    const buffer = Buffer.alloc(limit + 1);
    let size = 0;
    for (let got; size <= limit && (got = readSync(fd, buffer, size, limit + 1 - size, null)) > 0;) size += got;
    if (size > limit) return "changed while it was being published";
    return buffer.subarray(0, size);
  } finally {
    closeSync(fd);
  }
}

function describe(message) {
  const location = message.location;
  if (!location) return { text: message.text, file: null, line: null, column: null };
  if (location.namespace === VIRTUAL) {
    return { text: message.text, file: location.file, line: location.line, column: location.column };
  }
  const absolute = resolve(root, location.file);
  if (!inside(absolute)) {
    return { text: "esbuild reported an error in a file outside the snapshot", file: null, line: null, column: null };
  }
  return {
    text: message.text.split(root + sep).join(""),
    file: treePath(absolute),
    line: location.line,
    column: location.column,
  };
}

// A bundle, and what it left out: a package not installed that the bundle still refers to is
// refused by building again with it refused (esbuild then names where it is imported).
async function bundle(entry) {
  let output = await bundleOnce(entry);
  const reached = output.stubbed.filter(({ specifier, scheme }) => !scheme && !refuseMissing.has(specifier));
  if (reached.length > 0) {
    for (const { specifier } of reached) refuseMissing.add(specifier);
    output = await bundleOnce(entry);
  }
  return output;
}

async function bundleOnce(entry) {
  const result = await esbuild.build({
    entryPoints: [resolve(root, entry)],
    absWorkingDir: root,
    bundle: true,
    write: false,
    platform: "neutral",
    format: "iife",
    globalName: "__qjsflow_module",
    target: "es2022",
    // Async functions and generators are compiled to generators driven through
    // Promise.prototype.then, which the sandbox makes carry the step scope across each await
    // (QuickJS's native await would bypass it): a call after any await inside a step body is
    // still named after that step.
    supported: { "async-await": false, "async-generator": false, "for-await": false },
    charset: "ascii",
    legalComments: "none",
    logLevel: "silent",
    tsconfigRaw: "{}",
    // Packages resolve as Cloudflare's bundler resolves them for Workers.
    mainFields: ["browser", "module", "main"],
    conditions: ["workerd", "worker", "browser"],
    resolveExtensions: [".ts", ".mts", ".js", ".mjs", ".cjs", ".json"],
    plugins: [guard],
    // A map from bundle positions to tree paths (relative to the root, where the out file
    // would be), so errors name the author's file, line and column. No sources inside it.
    sourcemap: "external",
    sourcesContent: false,
    outfile: resolve(root, "__qjsflow_bundle.js"),
    metafile: true,
    ...(compat === null ? {} : { inject: [NODE_GLOBALS], define: { global: "globalThis" } }),
  });
  const code = result.outputFiles.find((file) => file.path.endsWith(".js")).text;
  const map = result.outputFiles.find((file) => file.path.endsWith(".js.map")).text;
  // Which stubs the bundle kept: code it keeps refers to them.
  const kept = new Set();
  for (const output of Object.values(result.metafile.outputs)) {
    for (const [input, use] of Object.entries(output.inputs)) {
      if (input.startsWith(`${MISSING}:`) && use.bytesInOutput > 0) kept.add(input.slice(MISSING.length + 1));
    }
  }
  const stubbed = [...kept].map((specifier) => ({ specifier, ...missing.get(specifier) }));
  return { entry, code, map, stubbed };
}

const outputs = [];
const errors = [];
const keptStubs = new Set();
// The bundles are bounded as they are made, not after all of them are in memory.
let outputBytes = 0;
for (const entry of request.entries) {
  try {
    const output = await bundle(entry);
    outputBytes += output.code.length + output.map.length;
    if (outputBytes > request.maxOutputBytes) {
      errors.push({ text: `the bundles are larger than ${request.maxOutputBytes} bytes in all (at ${entry})`,
                    file: null, line: null, column: null });
      break;
    }
    outputs.push({ entry: output.entry, code: output.code, map: output.map });
    for (const { specifier } of output.stubbed) keptStubs.add(specifier);
  } catch (failure) {
    const messages = failure && Array.isArray(failure.errors) ? failure.errors : null;
    if (!messages) throw failure;
    errors.push(...messages.map(describe));
  }
}
// Said at publish: every import left out, and whether the bundle still refers to it.
const warnings = [...missing.entries()].filter(([specifier]) => !refuseMissing.has(specifier))
  .map(([specifier, { importer, why }]) => {
    const kept = keptStubs.has(specifier);
    return `${importer || "the entry"}: imports "${specifier}", left out of the snapshot (${why})` +
      (kept ? "; the bundle keeps code that uses it, which throws if it runs" : "; no workflow reaches it");
  });
process.stdout.write(JSON.stringify(errors.length ? { errors } : { outputs, inputs, warnings }));
