// What QuickJS has that the standard library declarations lack; read only by the prelude's
// type check (scripts/lint_prelude.py), never shipped.
declare class InternalError extends Error {}
declare function atob(data: string): string;
