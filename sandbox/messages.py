"""The layout of a message from the pool to an executor (each one frame: sandbox/frames.py).

A message is a JSON header, and for a drive, after a newline, the drive's request as the
prelude reads it. The header holds what the executor itself reads: the message's type, the
bundle fields (`_Executor.bundle_fields` in sandbox/pool.py), and of the request only its
limits and the run's compute so far. The executor hands the request's text to the prelude
as it came, unparsed and unwritten (parsing the whole message and writing the request out
again cost a drive ~0.05 ms after an idle moment). JSON as written here never holds a raw
newline: the first one ends the header.
"""

from __future__ import annotations

from typing import Any

from qjsflow.bridge.codec import dumps, loads

__all__ = ["Message", "drive_message", "read_message"]

# A message as the executor reads it: its header, and the request's text ("" for none).
Message = tuple[dict[str, Any], str]


def drive_message(request: dict[str, Any], **fields: Any) -> bytes:
    """A drive of `request` (as `request_to_wire` makes it), with the header's `fields`."""
    head = {"type": "drive", "limits": request["limits"], "cpuUsedS": request["cpuUsedS"]}
    return dumps({**head, **fields}) + b"\n" + dumps(request)


def read_message(payload: bytes) -> Message:
    """A message's header, and the request's text after it."""
    head, _, request = payload.partition(b"\n")
    return loads(head, max_depth=None), request.decode("utf-8")
