# The two commands of the README. Each installs what it needs first (scripts/setup.sh).
.PHONY: setup demo test check lint bench check-wheel

setup:
	@scripts/setup.sh

demo: setup
	@scripts/demo.sh

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/python scripts/lint_prelude.py

test: lint
	.venv/bin/pytest
	scripts/check-wheel.sh

# The fast tier while you work (under a minute): everything but the tests marked slow.
check: lint
	.venv/bin/pytest -m "not slow" -q

# The wheel as a user installs it, outside the checkout (part of `make test`).
check-wheel: setup
	scripts/check-wheel.sh

bench: setup
	.venv/bin/python -m pip install -q --disable-pip-version-check --config-settings editable_mode=strict -e '.[bench]'
	.venv/bin/python -m bench
	.venv/bin/python -m bench.sandbox
	.venv/bin/python -m bench.postgres
	.venv/bin/python -m bench.scaleout
	.venv/bin/python -m bench.console
	.venv/bin/python -m bench.tracing
