// The virtual module "qjsflow". The error classes are defined here, in the bundle itself, so a
// snapshot never depends on the version of the runtime that drives it; the runtime recognises
// them by `name`. `db` delegates at call time to the runtime installed by the sandbox.
export class FatalError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = "FatalError";
  }
}
export class NonRetryableError extends FatalError {
  constructor(message, options) {
    super(message, options);
    this.name = "NonRetryableError";
  }
}
export class RetryableError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = "RetryableError";
    this.retryAfter = options && options.retryAfter !== undefined ? options.retryAfter : undefined;
  }
}
export class WorkflowEntrypoint {
  constructor(ctx, env) {
    this.ctx = ctx;
    this.env = env;
  }
}
// How the sandbox tells a workflow class from any other class with the same shape.
Object.defineProperty(WorkflowEntrypoint, Symbol.for("qjsflow.workflow"), { value: true });
function runtime() {
  const installed = globalThis.__qjsflow;
  if (!installed) throw new Error("qjsflow: the workflow runtime is not installed here");
  return installed;
}
// The run's env (the same object as `this.env` of a WorkflowEntrypoint): the module is loaded
// after the run's env is made.
export const env = globalThis.__qjsflow ? globalThis.__qjsflow.env : undefined;
export const db = Object.freeze({
  sql(sql, params) {
    return runtime().db.sql(sql, params);
  },
});
// A parent waits for a child instance (`env.MY_WORKFLOW.create(...)`) to end, durably: each
// look at its status is a journaled call and each pause a durable sleep, the pauses doubling
// from `firstMs` to `maxMs`. Returns the child's last status ({ status, output, error }).
export async function waitForInstance(step, instance, options) {
  const given = options || {};
  let pause = given.firstMs === undefined ? 1000 : given.firstMs;
  const most = given.maxMs === undefined ? 3600000 : given.maxMs;
  for (;;) {
    const seen = await instance.status();
    if (seen.status === "complete" || seen.status === "errored" || seen.status === "terminated") {
      return seen;
    }
    await step.sleep(`wait for ${instance.id}`, pause);
    pause = Math.min(pause * 2, most);
  }
}
// Tags of this run (`qjsflow list --tag KEY=VALUE` finds it by them), set durably: a
// journaled call, made once however often the body replays. Returns the run's tags.
export function setTags(step, tags) {
  return step.tool("setTags", "qjsflow.tags", { tags });
}
