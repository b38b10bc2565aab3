// The virtual module "cloudflare:workers": the names Cloudflare code imports. Workflows are
// WorkflowEntrypoint subclasses; WorkerEntrypoint and DurableObject are inert base classes, so
// a file that also holds a Worker or a Durable Object bundles (they never run here).
export { WorkflowEntrypoint, NonRetryableError, FatalError, RetryableError } from "qjsflow";
export class WorkerEntrypoint {
  constructor(ctx, env) {
    this.ctx = ctx;
    this.env = env;
  }
}
export class DurableObject {
  constructor(ctx, env) {
    this.ctx = ctx;
    this.env = env;
  }
}
