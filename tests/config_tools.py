"""A tool for the scope-configuration tests, loaded by worker processes through `--tools`:
it answers whether the secret value it was handed is the one its own process was given."""

from __future__ import annotations

import os
from typing import Any


async def check(args: Any) -> Any:
    return {"resolved": args["key"] == os.environ.get("ACME_API_KEY", "\0unset")}


TOOLS = {"check": check}
