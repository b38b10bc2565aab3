// The virtual module "cloudflare:workers": the names Cloudflare Workflows code imports.
export { WorkflowEntrypoint, NonRetryableError, FatalError, RetryableError } from "qjsflow";
