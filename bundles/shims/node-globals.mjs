// Under Cloudflare's nodejs_compat flag, `process` and `Buffer` are globals: esbuild injects
// these wherever a bundle uses them as free names (bundles/driver.mjs).
import process from "node:process";
import { Buffer } from "node:buffer";

export { process, Buffer };
