"""`python -m qjsflow.bundles install-esbuild`: the set-up step that fills a checkout's
`.jstools/` with the pinned esbuild (and the TypeScript the tests use)."""

import sys

from qjsflow.bundles.toolchain import ESBUILD_VERSION, install_for_development

if sys.argv[1:] != ["install-esbuild"]:
    sys.exit("usage: python -m qjsflow.bundles install-esbuild")
print(f"esbuild {ESBUILD_VERSION} ready in {install_for_development()}")
