// What QuickJS has that the standard library declarations lack; read only by the prelude's
// type check (scripts/lint_prelude.py), never shipped.
declare class InternalError extends Error {}
declare function atob(data: string): string;
interface ErrorConstructor {
  /** How many frames the engine writes into a new error's stack (an accessor). */
  stackTraceLimit: unknown;
}
