"""Length-prefixed frames: a 4-byte big-endian length, then that many bytes of JSON."""

from __future__ import annotations

import os
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the executor reads frames synchronously and never loads asyncio
    import asyncio

__all__ = ["MAX_FRAME_BYTES", "FrameError", "frame", "read_frame_async", "read_frame_fd"]

MAX_FRAME_BYTES = 64 * 1024 * 1024
_HEADER = struct.Struct(">I")


class FrameError(Exception):
    """The peer closed the pipe or sent a frame over the size limit."""


def frame(payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME_BYTES}")
    return _HEADER.pack(len(payload)) + payload


def read_frame_fd(fd: int) -> bytes | None:
    """Blocking read of one frame from a file descriptor; None at a clean end of input."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
    body = _read_exactly(fd, size)
    if body is None:
        raise FrameError("input ended inside a frame")
    return body


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            if remaining == size:
                return None
            raise FrameError("input ended inside a frame")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


async def read_frame_async(reader: asyncio.StreamReader, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    try:
        header = await reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        if size > max_bytes:
            raise FrameError(f"frame of {size} bytes exceeds {max_bytes}")
        return await reader.readexactly(size)
    except EOFError:  # asyncio.IncompleteReadError is one
        raise FrameError("the executor closed its pipe") from None
