#!/usr/bin/env bash
# Until the full demo lands: publish fixtures/ into a fresh database and print what was published.
set -euo pipefail
cd "$(dirname "$0")/.."
workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT
.venv/bin/qjsflow --db "$workdir/demo.db" publish fixtures --scope demo
