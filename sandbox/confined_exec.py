"""`python -I -m qjsflow.sandbox.confined_exec SPEC PROGRAM ARGS…`: run a program (the
bundler) under Landlock.

The build parses hostile source trees; should a bug in the bundler be exploited by one, the
process may read only what a build needs — the tree, the esbuild package, the driver, and the
system's programs and libraries (read and execute) — and write nothing, connect nowhere (its
answer goes out on stdout, a pipe it already holds). SPEC is JSON: {"read": [paths],
"exec": [paths], "mode": "require" | "best-effort" | "off"}. The rules apply to the program
this process becomes (`execv`) and to the esbuild service it starts.
"""

from __future__ import annotations

import os
import sys

from qjsflow.bridge.codec import loads
from qjsflow.sandbox.confine import confine_paths


def main() -> None:
    spec = loads(sys.argv[1])
    program, arguments = sys.argv[2], sys.argv[2:]
    grants = [(path, "read") for path in spec["read"]]
    grants += [(path, "execute") for path in spec["exec"]]
    layers = confine_paths(grants, spec["mode"])
    if spec["mode"] == "require" and layers.missing:
        sys.exit(f"qjsflow build: confinement required but missing: {'; '.join(layers.missing)}")
    os.execv(program, arguments)


if __name__ == "__main__":
    main()
