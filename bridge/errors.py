"""The root of every error qjsflow raises on the host side.

    QjsflowError
    ├── InvalidInput            bad input from a caller (exit code 2 in the CLI)
    │   └── bundles.PublishError        a source tree refused or not bundled
    │       ├── bundles.SourceTreeError     the tree breaks a rule (file, size, path)
    │       └── bundles.BundleError         esbuild reported errors located in the tree
    ├── ToolchainError          the environment lacks something (esbuild, node)
    └── CodecError              JSON that is malformed, too large or too deep

Each constructor takes the facts and builds a message that says what was wrong and, where
there is something to do, what to do.
"""

from __future__ import annotations

__all__ = ["CodecError", "InvalidInput", "QjsflowError", "ToolchainError"]


class QjsflowError(Exception):
    """Every error raised by qjsflow on the host side derives from this."""


class InvalidInput(QjsflowError, ValueError):
    """The caller supplied something qjsflow refuses: a tree, an id, a payload."""


class ToolchainError(QjsflowError, RuntimeError):
    """A tool qjsflow needs is missing or broken; the message says how to install it."""


class CodecError(InvalidInput):
    """JSON text that cannot be accepted: malformed, non-standard, too large or too deep."""
