#!/usr/bin/env bash
# Everything qjsflow needs on a fresh machine, idempotent: Node.js and npm (for esbuild), a
# virtualenv with the package and its dev tools, and the pinned esbuild (and TypeScript, for
# the tests) in .jstools/.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages are installed only where they are missing and this user may (root, as in
# CI); anyone else is told exactly what to install.
system_packages() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing $* from Debian's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "setup: missing $*: install them (Debian: sudo apt-get install $*) and run this again" >&2
    exit 1
  fi
}

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  system_packages nodejs npm
fi

# PostgreSQL's server binaries, for the tests of the PostgreSQL journal (a test starts its own
# server in a temporary folder; nothing is started here).
# (Or point QJSFLOW_TEST_POSTGRES_URL at a server of your own and skip this.)
if [ -z "${QJSFLOW_TEST_POSTGRES_URL:-}" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  system_packages postgresql
fi

# PgBouncer, for the journal's contract tests through a transaction-pooling bouncer.
if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
  system_packages pgbouncer
fi

# iproute2 and util-linux, for the tests that run a worker on a test host of their own (a
# network namespace) and bind a time zone over /etc/localtime (a mount namespace).
if ! command -v ip >/dev/null || ! command -v tc >/dev/null || ! command -v unshare >/dev/null; then
  system_packages iproute2 util-linux
fi

# Chromium, for the console's browser tests (Playwright drives the system browser: its own
# browser download is not used).
if ! command -v chromium >/dev/null; then
  system_packages chromium
fi

python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$python" -m venv .venv
fi

# The package is installed editable in setuptools' strict mode: a tree of links under build/
# presents runner/, sandbox/, bridge/, bundles/, fixtures/ and qjsflow/ (the root module) as qjsflow.*, so Python,
# mypy and editors all resolve `qjsflow.runner...` by path (no import hook). The tree lists
# files, so it is made again when a file is added or removed, as when pyproject.toml or the dev
# tools' lock changed since the last install.
stamp=.venv/.qjsflow-installed
tree=$(find qjsflow runner sandbox bridge bundles fixtures -type f ! -path '*/__pycache__/*' |
  LC_ALL=C sort | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ requirements-dev.txt -nt "$stamp" ] ||
  [ "$(cat "$stamp")" != "$tree" ] || ! ls -d build/__editable__.qjsflow-* >/dev/null 2>&1; then
  echo "setup: installing qjsflow and its dev tools into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check -c requirements-dev.txt \
    --config-settings editable_mode=strict -e '.[dev]'
  echo "$tree" >"$stamp"
fi

.venv/bin/python -m qjsflow.bundles install-esbuild >/dev/null

# The package's bytecode, compiled as pip compiles an installed package's. Where the
# environment sets PYTHONDONTWRITEBYTECODE, Python never caches it, and every command would
# compile again each module it loads (~50 ms of a `qjsflow status` of ~150-230 ms). Modules
# changed since are compiled again as they are imported, as always.
.venv/bin/python -m compileall -q build/__editable__.qjsflow-* >/dev/null
