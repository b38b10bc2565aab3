"""The engine: a drive from its lease to its end (driver), the servicing of a drive's
ops (host, steps), the worker's claim loop, the built-in bindings' tools."""
