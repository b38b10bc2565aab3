"""A tool for the scope-configuration tests, loaded by worker processes through `--tools`:
it answers whether the secret value it was handed is the tests' secret (so a worker resolved
the handle, from its environment or a mounted file)."""

from __future__ import annotations

from typing import Any

# The value the tests give the workers that may resolve it (an environment variable, or a
# mounted file), and only them.
SECRET = "s3cret-value-only-workers-hold"


async def check(args: Any) -> Any:
    return {"resolved": args["key"] == SECRET}


TOOLS = {"check": check}
