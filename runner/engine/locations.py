"""Where an error happened, in the author's files: the engine's stack frames (positions in
the bundle) mapped through the bundle's source map to `file:line:column` in tree paths.

Frames of the sandbox's own code are dropped (the bundle's lines are numbered from
`RULES.bundle_first_line`, the prelude's below it), and so are frames in the virtual modules;
what is left is a short stack that never names a host path (the map holds tree paths only).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable

from qjsflow.bridge.codec import loads
from qjsflow.bridge.rules import RULES

__all__ = ["Locator", "SourceMap", "author_frames"]

_FRAME = re.compile(
    r"^\s*at (?P<function>.{0,200}?) \(<input>:(?P<line>\d{1,9}):(?P<column>\d{1,9})\)$"
)
# A frame this module wrote (a step's error, journaled, thrown again on replay).
_LOCATED = re.compile(
    r"^at (?:(?P<function>.{1,200}) \()?(?P<file>[^ ():]{1,400}):\d{1,9}:\d{1,9}\)?$"
)
_BASE64 = {
    c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
}
_MOST_FRAMES = 8
_ANONYMOUS = {"<anonymous>", "<eval>", ""}

Locator = Callable[[str | None], str | None]


class SourceMap:
    """A source map (v3) read once: for each generated line, its segments' columns and the
    original (source, line, column) they map to, all 0-based."""

    def __init__(self, text: str) -> None:
        data = loads(text, max_depth=None)
        self.sources: list[str] = [str(source) for source in data.get("sources", [])]
        self._columns: list[list[int]] = []
        self._origins: list[list[tuple[int, int, int]]] = []
        source = line = column = 0
        for generated in str(data.get("mappings", "")).split(";"):
            columns: list[int] = []
            origins: list[tuple[int, int, int]] = []
            at = 0
            for segment in generated.split(","):
                values = _vlq(segment)
                if len(values) < 4:
                    continue
                at += values[0]
                source += values[1]
                line += values[2]
                column += values[3]
                columns.append(at)
                origins.append((source, line, column))
            self._columns.append(columns)
            self._origins.append(origins)

    def original(self, line: int, column: int) -> tuple[str, int, int] | None:
        """Where the generated 0-based (line, column) came from: (source, line, column), 1-based
        line and column as editors show them; None where nothing maps."""
        if not 0 <= line < len(self._columns):
            return None
        index = bisect_right(self._columns[line], column) - 1
        if index < 0:
            return None
        source, original_line, original_column = self._origins[line][index]
        if not 0 <= source < len(self.sources):
            return None
        return self.sources[source], original_line + 1, original_column + 1


def _vlq(segment: str) -> list[int]:
    values, shift, value = [], 0, 0
    for char in segment:
        digit = _BASE64.get(char)
        if digit is None:
            return []
        value += (digit & 31) << shift
        if digit & 32:
            shift += 5
            continue
        values.append(-(value >> 1) if value & 1 else value >> 1)
        shift = value = 0
    return values


def author_frames(stack: str | None, source_map: SourceMap | None) -> str | None:
    """The frames of `stack` that are in the author's files, as `at fn (file:line:column)`
    lines, innermost first; None when none is. Frames already in that form are kept when they
    name a file of this bundle (an author can write any `stack`: nothing else gets through)."""
    if not stack or source_map is None:
        return None
    frames: list[str] = []
    sources = set(source_map.sources)
    for text in stack.splitlines():
        match = _FRAME.match(text)
        if match is None:
            located = _LOCATED.match(text)
            if located is not None and located["file"] in sources:
                frames.append(text)  # already the author's (it names a file of this bundle)
            continue
        line = int(match["line"]) - RULES.bundle_first_line
        found = source_map.original(line, max(0, int(match["column"]) - 1))
        if line < 0 or found is None or ":" in found[0]:  # the sandbox's, or a virtual module
            continue
        where = f"{found[0]}:{found[1]}:{found[2]}"
        function = match["function"]
        frames.append(f"at {where}" if function in _ANONYMOUS else f"at {function} ({where})")
        if len(frames) == _MOST_FRAMES:
            break
    return "\n".join(frames) or None
