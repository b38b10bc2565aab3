// The names Cloudflare code imports from "cloudflare:workers" and "cloudflare:workflows", as
// qjsflow provides them.
declare module "cloudflare:workers" {
  export {
    WorkflowEntrypoint,
    NonRetryableError,
    FatalError,
    RetryableError,
  } from "qjsflow";
  export type { WorkflowEvent, WorkflowStep, WorkflowStepConfig } from "qjsflow";
  /** Inert here: a Worker in the same file bundles, but only workflows run. */
  export abstract class WorkerEntrypoint<Env = unknown> {
    constructor(ctx: unknown, env: Env);
    protected ctx: unknown;
    protected env: Env;
  }
  /** Inert here: a Durable Object in the same file bundles, but only workflows run. */
  export abstract class DurableObject<Env = unknown> {
    constructor(ctx: unknown, env: Env);
    protected ctx: unknown;
    protected env: Env;
  }
}
declare module "cloudflare:workflows" {
  export { NonRetryableError } from "qjsflow";
}
