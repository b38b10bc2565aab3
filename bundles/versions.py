"""The pinned versions of the bundler (and of the compiler the tests type-check with): their own
module, so that naming them (the command line's help, `doctor`) loads no toolchain code."""

from __future__ import annotations

__all__ = ["ESBUILD_VERSION", "TYPESCRIPT_VERSION"]

ESBUILD_VERSION = "0.28.2"
TYPESCRIPT_VERSION = "5.9.3"  # for the tests only: publishing never type-checks
