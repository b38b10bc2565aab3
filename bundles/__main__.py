"""`python -m bundles install-esbuild`: the set-up step that fetches the pinned esbuild."""

import sys

from bundles.esbuild import ESBUILD_VERSION, install

if sys.argv[1:] != ["install-esbuild"]:
    sys.exit("usage: python -m bundles install-esbuild")
print(f"esbuild {ESBUILD_VERSION} ready in {install()}")
