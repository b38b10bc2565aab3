// Types for workflow authors: `import { ... } from "qjsflow"`. Copy this file (and
// cloudflare-workers.d.ts) into your project, or list this folder in tsconfig "typeRoots"/
// "include", for editor completion. Publishing never needs it: esbuild strips types.
declare module "qjsflow" {
  /** Milliseconds, or "N unit[s]" with unit second, minute, hour, day, week, month or year. */
  export type WorkflowDuration = number | `${number} ${DurationUnit}` | `${number} ${DurationUnit}s`;
  export type DurationUnit = "second" | "minute" | "hour" | "day" | "week" | "month" | "year";
  export type WorkflowBackoff = "constant" | "linear" | "exponential";

  export interface WorkflowStepConfig {
    retries?: {
      /** Retries after the first attempt (default 5). */
      limit?: number;
      /** Delay before the first retry (default 10 seconds), or a function of the failed
       * attempt that gives the delay before the next one (called once per failure; a throw or
       * a value that is no duration ends the retries). */
      delay?: WorkflowDuration | ((failed: { ctx: WorkflowStepContext; error: unknown }) => WorkflowDuration);
      /** How the delay grows (default "exponential"). */
      backoff?: WorkflowBackoff;
    };
    /** Per attempt (default 10 minutes). */
    timeout?: WorkflowDuration;
  }

  export interface WorkflowStepContext {
    step: { name: string; count: number };
    /** 1 on the first attempt. */
    attempt: number;
    config: WorkflowStepConfig;
  }

  export interface WorkflowEvent<T = unknown> {
    payload: T;
    timestamp: Date;
    instanceId: string;
    workflowName: string;
  }

  export interface ReceivedEvent<T = unknown> {
    type: string;
    payload: T;
    timestamp: Date;
  }

  export interface Notification {
    title: string;
    body?: string;
    link?: string;
  }

  export interface WorkflowStep {
    /** Run `fn` once; its result is journaled and replayed, never recomputed. */
    do<T>(name: string, fn: (ctx: WorkflowStepContext) => Promise<T> | T): Promise<T>;
    do<T>(
      name: string,
      config: WorkflowStepConfig,
      fn: (ctx: WorkflowStepContext) => Promise<T> | T,
    ): Promise<T>;
    sleep(name: string, duration: WorkflowDuration): Promise<void>;
    sleepUntil(name: string, timestamp: Date | number): Promise<void>;
    /** Rejects with a catchable error when the timeout (default 24 hours) passes. */
    waitForEvent<T = unknown>(
      name: string,
      options: { type: string; timeout?: WorkflowDuration },
    ): Promise<ReceivedEvent<T>>;
    /** Call the host tool bound at `address` once; the call is journaled and audited. */
    tool<T = unknown>(
      name: string,
      address: string,
      args: unknown,
      config?: WorkflowStepConfig,
    ): Promise<T>;
    /** Best-effort side channel, sent at most once. */
    notify(message: Notification): Promise<void>;
  }

  export interface SqlResult<Row = Record<string, unknown>> {
    rows: Row[];
    changes: number;
    lastInsertRowid: number;
  }

  export interface Database {
    /** One parameterized statement on the run's scope database, journaled like a step. */
    sql<Row = Record<string, unknown>>(sql: string, params?: unknown[]): Promise<SqlResult<Row>>;
  }

  export const db: Database;

  export interface WorkflowEnv {
    db: Database;
    [binding: string]: unknown;
  }

  /** A secret binding: an opaque handle, printed as "[secret NAME]", passed only to tools. */
  export interface Secret {
    readonly __secret: unique symbol;
  }

  /** The run's env: the same object as `this.env` of a WorkflowEntrypoint. */
  export const env: WorkflowEnv;

  /** A child instance's status, as Cloudflare's `InstanceStatus`. */
  export interface InstanceStatus<T = unknown> {
    status: "queued" | "running" | "paused" | "errored" | "terminated" | "complete" | "waiting";
    output: T | null;
    error: { name: string; message: string } | null;
  }
  /** Waits, durably, until a child instance ends: status looks and sleeps, doubling from
   * firstMs (1 s) to maxMs (1 hour). */
  export function waitForInstance<T = unknown>(
    step: WorkflowStep,
    instance: { id: string; status(): Promise<InstanceStatus<T>> },
    options?: { firstMs?: number; maxMs?: number },
  ): Promise<InstanceStatus<T>>;

  /** Sets tags of this run (at most 20; `qjsflow list --tag KEY=VALUE` finds it by them), as
   * a journaled call: made once however often the body replays. Resolves to all its tags. */
  export function setTags(
    step: WorkflowStep,
    tags: Record<string, string>,
  ): Promise<Record<string, string>>;

  /** Fails the step (or the run) at once: no retries. */
  export class FatalError extends Error {
    constructor(message?: string, options?: { cause?: unknown });
  }
  export class NonRetryableError extends FatalError {}
  export class RetryableError extends Error {
    constructor(message?: string, options?: { retryAfter?: WorkflowDuration; cause?: unknown });
    retryAfter?: WorkflowDuration;
  }

  export abstract class WorkflowEntrypoint<Env = WorkflowEnv, Payload = unknown> {
    constructor(ctx: unknown, env: Env);
    protected ctx: unknown;
    protected env: Env;
    abstract run(event: WorkflowEvent<Payload>, step: WorkflowStep): Promise<unknown>;
  }
}
