// The names Cloudflare Workflows code imports from "cloudflare:workers", as qjsflow provides them.
declare module "cloudflare:workers" {
  export {
    WorkflowEntrypoint,
    NonRetryableError,
    FatalError,
    RetryableError,
  } from "qjsflow";
  export type { WorkflowEvent, WorkflowStep, WorkflowStepConfig } from "qjsflow";
}
