// The virtual module "cloudflare:workflows", where Cloudflare exports NonRetryableError.
export { NonRetryableError } from "qjsflow";
