// Bundles the entries of one staged snapshot tree with esbuild's JS API, confined to that tree.
//
// Input (stdin, JSON): { esbuild, root, entries: [relative path], shims: {module: source} }.
// Output (stdout, JSON): { outputs: [{ entry, code }] } or { errors: [{ text, file, line, column }] }.
// The guard plugin resolves nothing outside `root`: absolute, escaping and bare imports are
// refused before esbuild touches the file system for them, and every load is checked by real
// path, so no host byte can reach a bundle or an error message.
import { readFileSync } from "node:fs";
import { realpathSync } from "node:fs";
import { isAbsolute, relative, resolve, sep } from "node:path";
import { createRequire } from "node:module";

const request = JSON.parse(readFileSync(0, "utf8"));
const esbuild = createRequire(import.meta.url)(request.esbuild);
const root = realpathSync(request.root);
const shims = request.shims;
const VIRTUAL = "qjsflow-virtual";

const inside = (target) => target === root || target.startsWith(root + sep);
const refuse = (text) => ({ errors: [{ text }] });

const guard = {
  name: "qjsflow-guard",
  setup(build) {
    build.onResolve({ filter: /.*/ }, (args) => {
      if (args.kind === "entry-point") {
        return inside(resolve(root, args.path)) ? undefined : refuse("entry outside the snapshot");
      }
      if (Object.hasOwn(shims, args.path)) return { path: args.path, namespace: VIRTUAL };
      if (args.namespace === VIRTUAL) return refuse(`the module "${args.importer}" imports nothing`);
      if (isAbsolute(args.path)) {
        return refuse(`imports a file outside the snapshot: ${args.path} (absolute import)`);
      }
      if (!/^\.\.?(\/|$)/.test(args.path)) {
        return refuse(
          `imports the package "${args.path}": only relative imports inside the snapshot ` +
            `and the modules "qjsflow" and "cloudflare:workers" are allowed`,
        );
      }
      if (!inside(resolve(args.resolveDir, args.path))) {
        return refuse(`imports a file outside the snapshot: ${args.path}`);
      }
      return undefined;
    });
    build.onLoad({ filter: /.*/, namespace: "file" }, (args) => {
      let real;
      try {
        real = realpathSync(args.path);
      } catch {
        return refuse(`cannot read ${relative(root, args.path)}`);
      }
      if (!inside(real)) return refuse("imports a file outside the snapshot");
      return undefined;
    });
    build.onLoad({ filter: /.*/, namespace: VIRTUAL }, (args) => ({
      contents: shims[args.path],
      loader: "js",
    }));
  },
};

function describe(message) {
  const location = message.location;
  if (!location) return { text: message.text, file: null, line: null, column: null };
  const absolute = resolve(root, location.file);
  if (location.namespace === VIRTUAL) {
    return { text: message.text, file: location.file, line: location.line, column: location.column };
  }
  if (!inside(absolute)) {
    return { text: "esbuild reported an error in a file outside the snapshot", file: null, line: null, column: null };
  }
  return {
    text: message.text.split(root + sep).join(""),
    file: relative(root, absolute).split(sep).join("/"),
    line: location.line,
    column: location.column,
  };
}

async function bundle(entry) {
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
    mainFields: [],
    conditions: [],
    resolveExtensions: [".ts", ".mts", ".js", ".mjs", ".json"],
    loader: { ".ts": "ts", ".mts": "ts", ".js": "js", ".mjs": "js", ".json": "json", ".txt": "text" },
    plugins: [guard],
  });
  return { entry, code: result.outputFiles[0].text };
}

const outputs = [];
const errors = [];
// The bundles are bounded as they are made, not after all of them are in memory.
let outputBytes = 0;
for (const entry of request.entries) {
  try {
    const output = await bundle(entry);
    outputBytes += output.code.length;
    if (outputBytes > request.maxOutputBytes) {
      errors.push({ text: `the bundles are larger than ${request.maxOutputBytes} bytes in all (at ${entry})`,
                    file: null, line: null, column: null });
      break;
    }
    outputs.push(output);
  } catch (failure) {
    const messages = failure && Array.isArray(failure.errors) ? failure.errors : null;
    if (!messages) throw failure;
    errors.push(...messages.map(describe));
  }
}
process.stdout.write(JSON.stringify(errors.length ? { errors } : { outputs }));
