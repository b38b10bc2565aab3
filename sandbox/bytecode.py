"""The prelude compiled once per executor process, not once per drive.

Every drive gets a fresh QuickJS context, and compiling the prelude's ~75 KB into it took
~7 ms of the executor's CPU per drive (most of a short run's cost). The `quickjs` binding has
no call to cache bytecode, but the QuickJS it is built on exports `JS_WriteObject` and
`JS_ReadObject`: this module compiles the prelude to bytecode once, at the executor's start,
and loads that into each new context (~1 ms). The bytecode is our own, made in this process
from the prelude's source; nothing an author supplies is ever read as bytecode.

Reaching a context's `JSContext *` means reading the binding's object layout, so the fast path
is used only with the binding version whose layout was checked (`CHECKED_VERSIONS`), and only
after a self-check on a scratch context; otherwise, and on any failure, the prelude's source is
evaluated as before. `tests/test_prelude_bytecode.py` holds both paths to the same behaviour.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import quickjs

from qjsflow.bridge.rules import RULES

__all__ = [
    "PREPARING_HEAP",
    "BundleCode",
    "EnginePointers",
    "PreludeLoader",
    "collect_cycles_from",
    "engine_pointers",
]

CHECKED_VERSIONS = frozenset({"0.17.0.2"})
_GLOBAL = "__qjsflowPrelude"  # where the loaded prelude leaves `dispatch`, removed at once
_COMPILE_ONLY = 1 << 5  # JS_EVAL_FLAG_COMPILE_ONLY
_BYTECODE = 1 << 0  # JS_WRITE_OBJ_BYTECODE, JS_READ_OBJ_BYTECODE
# Written without the prelude's source text (its frames keep their lines): a third of the
# bytecode fewer to read into every context, and the prelude's functions do not show their
# source to author code.
_STRIP_SOURCE = 1 << 4  # JS_WRITE_OBJ_STRIP_SOURCE
_TAG_EXCEPTION = 6


class _JSValue(ctypes.Structure):
    """QuickJS's JSValue on 64-bit builds without NaN boxing: a union and a tag."""

    _fields_ = [("u", ctypes.c_uint64), ("tag", ctypes.c_int64)]


def _library() -> Any:
    import _quickjs  # noqa: PLC0415  (the binding's extension module: its path)

    library = ctypes.CDLL(str(Path(_quickjs.__file__)))
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "JS_GetRuntime": (ctypes.c_void_p, [ctypes.c_void_p]),
        "JS_Eval": (
            _JSValue,
            [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_int],
        ),
        "JS_WriteObject": (
            ctypes.c_void_p,
            [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), _JSValue, ctypes.c_int],
        ),
        "JS_ReadObject": (
            _JSValue,
            [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int],
        ),
        "JS_EvalFunction": (_JSValue, [ctypes.c_void_p, _JSValue]),
        "JS_FreeValue": (None, [ctypes.c_void_p, _JSValue]),
        "JS_GetGCThreshold": (ctypes.c_size_t, [ctypes.c_void_p]),
        "JS_SetGCThreshold": (None, [ctypes.c_void_p, ctypes.c_size_t]),
        "js_free": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    }
    for name, (result, arguments) in signatures.items():
        function = getattr(library, name)
        function.restype = result
        function.argtypes = arguments
    return library


def context_pointer(library: Any, context: quickjs.Context) -> int | None:
    """The `JSContext *` of a binding context: the object holds its type, then the runtime,
    then the context; checked (the context's runtime is the runtime before it)."""
    words = (ctypes.c_void_p * 4).from_address(id(context))
    if words[1] != id(type(context)) or not words[2] or not words[3]:
        return None
    if library.JS_GetRuntime(words[3]) != words[2]:
        return None
    return int(words[3])


@dataclass(frozen=True, slots=True)
class EnginePointers:
    """A context's `JSContext *` and its `JSRuntime *`, found once for the context: each look
    is a few calls through ctypes, which a drive made three times."""

    context: int
    runtime: int


def engine_pointers(library: Any, context: quickjs.Context) -> EnginePointers | None:
    """`context`'s pointers, when the bytecode path is in use (`library`) and they check."""
    pointer = None if library is None else context_pointer(library, context)
    if pointer is None:
        return None
    return EnginePointers(pointer, int(library.JS_GetRuntime(pointer)))


def _pointer(library: Any, context: quickjs.Context, found: EnginePointers | None) -> int | None:
    """`context`'s `JSContext *`: as `found` for it, else looked up."""
    return context_pointer(library, context) if found is None else found.context


def collect_cycles_from(library: Any, pointers: EnginePointers | None, size: int) -> None:
    """Let `context`'s heap reach `size` bytes before the engine next looks for garbage in
    cycles (it looks each time its heap has grown by half since the last look; a fresh context
    starts at ~0.6 MB, so a drive that builds up thousands of steps, all of them live, looked
    ten times, a third of its time). A drive sets half its memory limit: garbage in cycles is
    still collected long before the limit, and after the first look the engine sets its next
    threshold from what is live. Set, not raised: a drive's context comes from a preparation
    that let its heap grow further (`PREPARING_HEAP`), and its own memory limit decides."""
    if pointers is not None:
        library.JS_SetGCThreshold(pointers.runtime, size)


# Preparing a context (the prelude read and run, the intrinsics frozen) makes no garbage in
# cycles worth a look, yet crossed the engine's first threshold (256 kB) and looked once or
# twice: ~0.15 ms of the ~1.4 ms. Only the prelude's own code runs before the drive sets its
# threshold from its memory limit.
PREPARING_HEAP = 16 * 2**20


class PreludeLoader:
    """Evaluates the prelude in a fresh context, from bytecode when it can."""

    def __init__(self, source: str, *, fast: bool = True) -> None:
        self.source = source
        self.fast = False
        self._library: Any = None
        self._bytecode: ctypes.Array[ctypes.c_char] | None = None
        if fast and _binding_checked():
            self._compile()

    @property
    def library(self) -> Any:
        """The QuickJS library, when its bytecode path is in use (else None)."""
        return self._library if self.fast else None

    def evaluate(self, context: quickjs.Context, pointers: EnginePointers | None = None) -> Any:
        """`dispatch`, the value of the prelude, evaluated in `context` (whose `pointers` the
        caller may have found)."""
        if self.fast and self._bytecode is not None:
            pointer = _pointer(self._library, context, pointers)
            if pointer is not None:
                function = self._library.JS_ReadObject(
                    pointer, self._bytecode, len(self._bytecode), _BYTECODE
                )
                if function.tag != _TAG_EXCEPTION:
                    value = self._library.JS_EvalFunction(pointer, function)  # frees `function`
                    if value.tag != _TAG_EXCEPTION:
                        self._library.JS_FreeValue(pointer, value)
                        dispatch = context.get(_GLOBAL)
                        context.eval(f"delete globalThis.{_GLOBAL};")
                        return dispatch
            self.fast = False  # from now on, the source (the caller retries on a new context)
            raise RuntimeError("the prelude's bytecode could not be loaded")
        return context.eval(self.source)

    def _compile(self) -> None:
        """Compile once in a scratch context; keep the bytecode; check it loads and runs."""
        try:
            library = _library()
            scratch = quickjs.Context()
            pointer = context_pointer(library, scratch)
            if pointer is None:
                return
            text = f"globalThis.{_GLOBAL} = {self.source}".encode()
            function = library.JS_Eval(pointer, text, len(text), b"<prelude>", _COMPILE_ONLY)
            if function.tag == _TAG_EXCEPTION:
                return
            size = ctypes.c_size_t()
            buffer = library.JS_WriteObject(
                pointer, ctypes.byref(size), function, _BYTECODE | _STRIP_SOURCE
            )
            library.JS_FreeValue(pointer, function)
            if not buffer:
                return
            self._bytecode = ctypes.create_string_buffer(ctypes.string_at(buffer, size.value),
                                                         size.value)  # fmt: skip
            library.js_free(pointer, buffer)
            self._library = library
            self.fast = True
            probe = quickjs.Context()
            if not callable(self.evaluate(probe)):  # the self-check: loads, runs, answers
                self.fast = False
        except (OSError, AttributeError, RuntimeError, quickjs.JSException):
            self.fast = False


# Where a bundle's loaded bytecode leaves the function that runs it, for the prelude's `load`.
_BUNDLE_GLOBAL = "__qjsflowBundle"
BUNDLES_KEPT = 4
_BUNDLE_PAD = "\n" * (RULES.bundle_first_line - 1)  # as the prelude pads the bundle's source
_BUNDLE_BYTES_KEPT = 32 * 1024 * 1024


class BundleCode:
    """The bundles this executor drove lately, each compiled to bytecode once.

    Every drive evaluates its workflow's bundle into a fresh context; reading bytecode costs a
    fifth of compiling the source (a 400 kB bundle: ~24 -> ~4.4 ms here), and a worker drives
    the same few workflows again and again. The bundle is compiled from its text, here, as the
    body of a function: loading the bytecode (outside the binding, so with no time limit) only
    defines that function; the prelude then calls it through the binding, under the drive's
    limits, as it evaluated the source before. Only bytecode this process made is ever read.
    """

    def __init__(self, prelude: PreludeLoader) -> None:
        self._library = prelude.library
        self.kept: dict[str, ctypes.Array[ctypes.c_char]] = {}  # oldest first

    def define(
        self,
        context: quickjs.Context,
        text: str,
        memory_bytes: int,
        *,
        key: str | None = None,
        pointers: EnginePointers | None = None,
    ) -> bool:
        """Define the function that runs `text` (the bundle) at globalThis[_BUNDLE_GLOBAL] in
        `context`; False when that cannot be done (the caller evaluates the source: a syntax
        error is reported from there). Its bytecode is kept under `key`, the text's digest
        (else the text itself, which is hashed each time: ~0.1 ms for 400 kB)."""
        if self._library is None:
            return False
        pointer = _pointer(self._library, context, pointers)
        kept = text if key is None else key
        code = self.kept.pop(kept, None) or self.compile(text, memory_bytes)
        if pointer is None or code is None:
            return False
        self._keep(kept, code)
        function = self._library.JS_ReadObject(pointer, code, len(code), _BYTECODE)
        if function.tag == _TAG_EXCEPTION:
            return False
        value = self._library.JS_EvalFunction(pointer, function)  # frees `function`
        if value.tag == _TAG_EXCEPTION:
            return False
        self._library.JS_FreeValue(pointer, value)
        return True

    def compile(self, text: str, memory_bytes: int) -> ctypes.Array[ctypes.c_char] | None:
        scratch = quickjs.Context()
        scratch.set_memory_limit(memory_bytes)
        pointer = context_pointer(self._library, scratch)
        if pointer is None or not self._parses(pointer, text.encode()):
            return None
        # Line 1 holds the wrapper and the bundle starts where the prelude's source path puts
        # it, so its frames keep their lines; a newline ends a last line comment before the
        # wrapper closes.
        wrapped = (
            f"globalThis.{_BUNDLE_GLOBAL} = function () {{{_BUNDLE_PAD}{text}\n"
            "return typeof __qjsflow_module === 'undefined' ? undefined : __qjsflow_module;\n};"
        ).encode()
        function = self._library.JS_Eval(pointer, wrapped, len(wrapped), b"<input>",
                                         _COMPILE_ONLY)  # fmt: skip
        if function.tag == _TAG_EXCEPTION:
            return None
        size = ctypes.c_size_t()
        buffer = self._library.JS_WriteObject(pointer, ctypes.byref(size), function, _BYTECODE)
        self._library.JS_FreeValue(pointer, function)
        if not buffer:
            return None
        code = ctypes.create_string_buffer(ctypes.string_at(buffer, size.value), size.value)
        self._library.js_free(pointer, buffer)
        return code

    def _parses(self, pointer: int, source: bytes) -> bool:
        """Whether `source` is a program by itself. Only then is it one function's body once
        wrapped: text that is not (`}; f(); function g() {`, say) could close the wrapper and
        run when its bytecode is loaded, outside the drive's limits."""
        function = self._library.JS_Eval(pointer, source, len(source), b"<input>", _COMPILE_ONLY)
        if function.tag == _TAG_EXCEPTION:
            return False
        self._library.JS_FreeValue(pointer, function)
        return True

    def forget(self, key: str) -> None:
        """Drop the bytecode kept under `key` (its text is no longer held: sandbox/executor.py,
        `BundleTexts`)."""
        self.kept.pop(key, None)

    def _keep(self, key: str, code: ctypes.Array[ctypes.c_char]) -> None:
        self.kept[key] = code
        while len(self.kept) > BUNDLES_KEPT or (
            len(self.kept) > 1 and sum(len(c) for c in self.kept.values()) > _BUNDLE_BYTES_KEPT
        ):
            del self.kept[next(iter(self.kept))]


def _binding_checked() -> bool:
    try:
        return importlib.metadata.version("quickjs-ng") in CHECKED_VERSIONS
    except importlib.metadata.PackageNotFoundError:
        return False
