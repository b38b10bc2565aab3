#!/usr/bin/env bash
# Everything qjsflow needs on a fresh machine, idempotent: Node.js and npm (for esbuild), a
# virtualenv with the package and its dev tools, and the pinned esbuild (and TypeScript, for
# the tests) in .jstools/.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup: installing Node.js and npm from Debian's packages"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi

# PostgreSQL's server binaries, for the tests of the PostgreSQL journal (a test starts its own
# server in a temporary folder; nothing is started here).
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "setup: installing PostgreSQL from Debian's packages"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi

python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$python" -m venv .venv
fi

# Reinstall only when pyproject.toml or the dev tools' lock changed since the last install.
stamp=.venv/.qjsflow-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ requirements-dev.txt -nt "$stamp" ]; then
  echo "setup: installing qjsflow and its dev tools into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check -c requirements-dev.txt -e '.[dev]'
  touch "$stamp"
fi

.venv/bin/python -m qjsflow.bundles install-esbuild >/dev/null
