"""The prelude compiled once per executor process, not once per drive.

Every drive gets a fresh QuickJS context, and compiling the prelude's ~75 KB into it took
~7 ms of the executor's CPU per drive (most of a short run's cost). The `quickjs` binding has
no call to cache bytecode, but the QuickJS it is built on exports `JS_WriteObject` and
`JS_ReadObject`: this module compiles the prelude to bytecode once, at the executor's start,
and loads that into each new context (~1 ms). The bytecode is our own, made in this process
from the prelude's source; nothing an author supplies is ever read as bytecode.

Reaching a context's `JSContext *` means reading the binding's object layout, so the fast path
is used only with the binding version whose layout was checked (`_CHECKED_VERSIONS`), and only
after a self-check on a scratch context; otherwise, and on any failure, the prelude's source is
evaluated as before. `tests/test_prelude_bytecode.py` holds both paths to the same behaviour.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
from pathlib import Path
from typing import Any

import quickjs

__all__ = ["PreludeLoader"]

_CHECKED_VERSIONS = frozenset({"0.17.0.2"})
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
        "js_free": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    }
    for name, (result, arguments) in signatures.items():
        function = getattr(library, name)
        function.restype = result
        function.argtypes = arguments
    return library


def _context_pointer(library: Any, context: quickjs.Context) -> int | None:
    """The `JSContext *` of a binding context: the object holds its type, then the runtime,
    then the context; checked (the context's runtime is the runtime before it)."""
    words = (ctypes.c_void_p * 4).from_address(id(context))
    if words[1] != id(type(context)) or not words[2] or not words[3]:
        return None
    if library.JS_GetRuntime(words[3]) != words[2]:
        return None
    return int(words[3])


class PreludeLoader:
    """Evaluates the prelude in a fresh context, from bytecode when it can."""

    def __init__(self, source: str, *, fast: bool = True) -> None:
        self.source = source
        self.fast = False
        self._library: Any = None
        self._bytecode: ctypes.Array[ctypes.c_char] | None = None
        if fast and _binding_checked():
            self._compile()

    def evaluate(self, context: quickjs.Context) -> Any:
        """`dispatch`, the value of the prelude, evaluated in `context`."""
        if self.fast and self._bytecode is not None:
            pointer = _context_pointer(self._library, context)
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
            pointer = _context_pointer(library, scratch)
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


def _binding_checked() -> bool:
    try:
        return importlib.metadata.version("quickjs-ng") in _CHECKED_VERSIONS
    except importlib.metadata.PackageNotFoundError:
        return False
