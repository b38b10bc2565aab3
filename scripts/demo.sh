#!/usr/bin/env bash
# The README's first command: the whole story on a fresh embedded database.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/qjsflow demo
