#!/usr/bin/env bash
# The package as a user gets it: build the wheel, install it into a clean virtualenv outside
# the checkout, fetch the publish tools into a fresh per-user cache, and use it from another
# folder: --version, the demo, and a publish/start/status round trip.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

.venv/bin/python -m pip wheel -q --disable-pip-version-check --no-deps -w "$work/dist" .
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check "$work"/dist/qjsflow-*.whl
qjsflow="$work/venv/bin/qjsflow"

cd "$work"
export XDG_CACHE_HOME="$work/cache"
unset QJSFLOW_ESBUILD QJSFLOW_JSTOOLS_DIR
"$qjsflow" --version
if "$work/venv/bin/python" -c "import runner" 2>/dev/null; then
  echo "check-wheel: the wheel installed a top-level 'runner' module" >&2
  exit 1
fi
"$qjsflow" setup-tools
"$qjsflow" demo | tail -1

mkdir -p src/workflows
cat > src/workflows/hello.ts <<'TS'
import type { WorkflowEvent, WorkflowStep } from "qjsflow";
export default async (event: WorkflowEvent<{ name: string }>, step: WorkflowStep) =>
  step.do("greet", async () => `hello ${event.payload.name}`);
TS
snapshot=$("$qjsflow" --db journal.db --json publish src --scope acme |
  "$work/venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["snapshot_id"])')
"$qjsflow" --db journal.db --json start hello --scope acme --snapshot "$snapshot" \
  --input '{"name": "wheel"}' --run-id r1 >/dev/null
"$qjsflow" --db journal.db worker --until-idle 2>/dev/null  # start records; a worker drives
"$qjsflow" --db journal.db --json status r1 --scope acme |
  "$work/venv/bin/python" -c '
import json, sys
run = json.load(sys.stdin)
assert (run["status"], run["output"]) == ("completed", "hello wheel"), run
print("check-wheel: the installed wheel published, ran and reported a run")'
